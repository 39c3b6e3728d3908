// What every consumer of requests from a queue does around its messages, whatever they mean
// (orders and events at the orchestrator's intake, commands at a participant): N consumers of
// one queue, each a connection of its own with one message in hand (prefetch 1), the queue
// and its dead-letter queue `<queue>.dead` declared, publisher confirms on; a consumer whose
// connection breaks connects again, to the next node of `urls`, backing off. And the two
// messages a request is answered with: the reply to its `reply_to` and its dead letter.
//
// Thread-safe: Start() once, Stop() from any thread. `handle` runs on the consumers' threads,
// one message at a time per consumer; an exception from it drops the connection (the message
// goes back to the queue) and the consumer connects again.
//   amqp::Consumers c({.urls = urls, .queue = "orders", .log_name = "amqp_intake"},
//                     [](amqp::Connection& conn, const amqp::Delivery& d) { ... conn.Ack(d.tag);
//                     });
//   c.Start(); ...; c.Stop();
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/amqp/connection.hpp"
#include "common/metrics.hpp"

namespace idemsaga::common::amqp {

struct ConsumersOptions {
  // amqp://user:password@host:port/vhost, one per node of a cluster. Every consumer connects
  // to the first; when its connection breaks it connects to the next, round the list.
  std::vector<std::string> urls;
  std::string queue;
  // Of the queue and its dead-letter queue, when they are declared here (an existing queue is
  // used as it is). kQuorum on a cluster: a classic queue lives on one node and is
  // unavailable, with its messages, while that node is down.
  QueueType queue_type = QueueType::kClassic;
  int consumers = 4;
  // How long to wait before connecting again after the broker went away: the first time
  // round the list of nodes, doubled each time round after, up to max_reconnect_backoff
  // (with jitter, so that the consumers of a process do not knock in step).
  std::chrono::milliseconds reconnect_backoff{500};
  std::chrono::milliseconds max_reconnect_backoff{8000};
  // Log events are "<log_name>_connected" and "<log_name>_disconnected".
  std::string log_name = "amqp_consumer";
};

class Consumers {
 public:
  using Handle = std::function<void(Connection& conn, const Delivery& delivery)>;

  // Throws std::invalid_argument for no URL or one that is not amqp://... Counts consumers
  // connected again after a broken connection in `metrics` (may be null):
  // idemsaga_amqp_reconnects_total{queue}.
  Consumers(ConsumersOptions options, Handle handle, common::metrics::Registry* metrics = nullptr);
  ~Consumers();

  void Start();
  // Stops consuming and waits for the consumers; a message in hand goes back to the queue.
  void Stop();
  bool stopping() const { return stopping_; }
  // Sleeps up to `d`; false when stopping.
  bool Pause(std::chrono::milliseconds d);

 private:
  void Run(int index);

  ConsumersOptions options_;
  Handle handle_;
  common::metrics::Counter* reconnects_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::mutex declare_mutex_;  // a consumer's declarations and basic.consume
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

// A request's answer as data: an HTTP answer's parts, whichever way it goes out.
struct ReplyParts {
  int status = 200;
  std::string content_type;
  std::map<std::string, std::string> headers;
  std::string body;
};

// The reply to `request`: the answer's body, content type and headers, its status in the
// header `status`, and the request's correlation_id.
Message Reply(const Message& request, const ReplyParts& answer);

// The request as it came, minus its `Authorization` header (a dead-letter queue is read by
// operators, not tenants), with why it was refused in x-idemsaga-status, -error and -detail.
Message DeadLetter(const Message& request, int status, const std::string& code,
                   const std::string& detail);

// True when `m` has a header `name` (in any case), of any type.
bool Named(const Message& m, const char* name);
// The first string value of the header `name` (in any case), as a route reads a header given
// twice; "" when there is none.
std::string First(const Message& m, const char* name);
// The one string value of the header `name` (in any case); nullopt when it is missing, not a
// string, or given twice (Named() tells missing from malformed).
std::optional<std::string> OneHeader(const Message& m, const char* name);
// The Idempotency-Key header read as a route reads its header: how many there are (in any
// case, of any type) and the first one's value; a value that is not a string is given as
// "(<kind>)", which no key parser accepts (an sf-string of a number would be a guess).
std::pair<size_t, std::string> KeyHeader(const Message& m);

}  // namespace idemsaga::common::amqp
