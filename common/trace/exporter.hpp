// Exports finished spans in batches from a background thread (a common::Periodic), off the
// request path: a full batch as soon as there is one, the rest every flush interval. The queue is
// bounded: when it is full a span is dropped and counted, and the request that made it never waits.
// A batch its sink refuses is dropped and counted too (tracing must not grow memory while a
// collector is down).
//
// Thread-safe. The sink runs on one thread at a time.
//   Exporter exporter(Exporter::OtlpHttp("http://127.0.0.1:4318/v1/traces", {}), {});
//   Tracer tracer("inventory", &exporter);
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/periodic.hpp"
#include "common/trace/span.hpp"

namespace idemsaga::common::trace {

class Exporter {
 public:
  // Delivers one batch; throws (or returns false) when it could not.
  using Sink = std::function<bool(const std::vector<SpanData>&)>;

  struct Options {
    size_t max_queue = 20000;  // spans; several seconds of a busy service's spans
    // Fewer, larger deliveries: each is one request and one commit at the intake (a commit
    // per order's worth of spans would be a fifth commit per order); not so large that
    // encoding and decoding one costs the memory budget (the intake parses a batch into a
    // document: a batch of 1,000 spans, ~0.7 MiB of OTLP, was 3 MiB of the peak heap). At
    // 500 orders/s, batches of 500 cost ~0.03 commits per order.
    size_t max_batch = 500;
    // What waits in the queue is memory: half a second of a busy service's spans.
    std::chrono::milliseconds flush_interval{500};
    // How often the queue is looked at in between: a full batch goes as soon as it is there, so
    // a busy service's spans reach the store as a steady trickle of full batches. Sending half
    // a second's worth at once (about 20 batches at 1,200 orders/s) took a core for a tenth of
    // a second, every half second, and the orders running meanwhile were the slowest 2%.
    std::chrono::milliseconds tick{50};
  };

  Exporter(Sink sink, Options options);
  ~Exporter();

  void Enqueue(SpanData span);
  // Delivers everything queued now, on the calling thread.
  void Flush();

  long long dropped() const { return dropped_; }
  long long failed() const { return failed_; }
  long long exported() const { return exported_; }

  // POSTs OTLP/HTTP JSON to `url` (http://host:port/v1/traces) with exactly `headers` (the
  // collector's own credentials, if any): a collector is a third party, so no credential of
  // ours is ever added.
  static Sink OtlpHttp(const std::string& url, std::map<std::string, std::string> headers);

 private:
  // Delivers what is queued now, or only the full batches of it.
  void Drain(bool full_batches_only);
  void Tick();

  Sink sink_;
  Options options_;
  std::mutex queue_mutex_;
  std::deque<SpanData> queue_;
  std::mutex export_mutex_;
  std::atomic<long long> dropped_{0}, failed_{0}, exported_{0};
  std::chrono::steady_clock::time_point last_drain_;  // the flusher's own
  Periodic flusher_;  // last: stopped before the queue it drains goes
};

}  // namespace idemsaga::common::trace
