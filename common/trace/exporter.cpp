#include "common/trace/exporter.hpp"

#include <httplib.h>

#include <algorithm>

#include "common/log.hpp"
#include "common/trace/otlp.hpp"

namespace idemsaga::common::trace {

Exporter::Exporter(Sink sink, Options options)
    : sink_(std::move(sink)),
      options_(options),
      last_drain_(std::chrono::steady_clock::now()),
      flusher_("span_export", std::min(options_.tick, options_.flush_interval),
               [this] { Tick(); }) {
  flusher_.Start();
}

Exporter::~Exporter() {
  flusher_.Stop();
  Flush();  // what is left, once
}

void Exporter::Enqueue(SpanData span) {
  std::lock_guard lock(queue_mutex_);
  if (queue_.size() >= options_.max_queue) {
    ++dropped_;
    return;
  }
  queue_.push_back(std::move(span));
}

void Exporter::Flush() { Drain(false); }

void Exporter::Tick() {
  auto now = std::chrono::steady_clock::now();
  bool interval_over = now - last_drain_ >= options_.flush_interval;
  if (interval_over) last_drain_ = now;
  Drain(!interval_over);
}

void Exporter::Drain(bool full_batches_only) {
  std::lock_guard export_lock(export_mutex_);
  // What was queued when the drain began; spans that arrive meanwhile wait for the next one.
  // Under steady load a drain that chased the queue never ended, delivering a few spans at a
  // time: one request and one commit at the intake each, 30 a second.
  size_t due = 0;
  {
    std::lock_guard lock(queue_mutex_);
    due = queue_.size();
  }
  if (full_batches_only) due -= due % std::max<size_t>(1, options_.max_batch);
  while (due > 0) {
    std::vector<SpanData> batch;
    {
      std::lock_guard lock(queue_mutex_);
      while (!queue_.empty() && batch.size() < std::min(due, options_.max_batch)) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (batch.empty()) return;
    due -= batch.size();
    bool ok = false;
    try {
      ok = sink_(batch);
    } catch (const std::exception& e) {
      Log("span_export_failed", {{"spans", std::to_string(batch.size())}, {"error", e.what()}});
    }
    (ok ? exported_ : failed_) += static_cast<long long>(batch.size());
  }
}

Exporter::Sink Exporter::OtlpHttp(const std::string& url,
                                  std::map<std::string, std::string> headers) {
  auto scheme_end = url.find("://");
  auto path_start = url.find('/', scheme_end == std::string::npos ? 0 : scheme_end + 3);
  std::string base = path_start == std::string::npos ? url : url.substr(0, path_start);
  std::string path = path_start == std::string::npos ? "/v1/traces" : url.substr(path_start);
  // Used by one thread at a time (the exporter serialises its sink).
  auto client = std::make_shared<httplib::Client>(base);
  client->set_keep_alive(true);
  client->set_connection_timeout(1);
  client->set_read_timeout(3);
  httplib::Headers configured(headers.begin(), headers.end());
  return [client, path, configured](const std::vector<SpanData>& spans) {
    // A batch of spans with long messages could pass the intake's limit: one 413 would lose
    // every span of it.
    bool all = true;
    for (const auto& body : EncodeOtlpFitting(spans)) {
      auto r = client->Post(path.c_str(), configured, body, "application/json");
      all = all && r && r->status / 100 == 2;
    }
    return all;
  };
}

}  // namespace idemsaga::common::trace
