#include "common/amqp/consumers.hpp"

#include <algorithm>
#include <random>

#include "common/log.hpp"
#include "common/strings.hpp"

namespace idemsaga::common::amqp {

Consumers::Consumers(ConsumersOptions options, Handle handle, common::metrics::Registry* metrics)
    : options_(std::move(options)), handle_(std::move(handle)) {
  if (options_.urls.empty()) throw std::invalid_argument("--amqp-url names no broker");
  for (const auto& url : options_.urls) CheckUrl(url);
  if (metrics == nullptr) return;
  reconnects_ = &metrics
                     ->Counter("idemsaga_amqp_reconnects_total",
                               "Consumers connected, to the same or the next broker node, after a "
                               "connection that broke or could not be made.",
                               {"queue"})
                     .With({options_.queue});
}

Consumers::~Consumers() { Stop(); }

void Consumers::Start() {
  for (int i = 0; i < options_.consumers; ++i) threads_.emplace_back([this, i] { Run(i); });
}

void Consumers::Stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Consumers::Pause(std::chrono::milliseconds d) {
  std::unique_lock lock(mutex_);
  return !cv_.wait_for(lock, d, [this] { return stopping_.load(); });
}

void Consumers::Run(int index) {
  const size_t nodes = options_.urls.size();
  size_t node = 0;
  int failures = 0;  // in a row, since the last connection that consumed
  std::minstd_rand jitter(std::random_device{}() + index);
  while (!stopping_) {
    const std::string& url = options_.urls[node];
    bool consuming = false;
    try {
      Connection conn(url);
      {
        // One consumer at a time: RabbitMQ 3.10 answers two first declarations of a quorum
        // queue at once by closing the loser's connection at basic.consume (541
        // INTERNAL_ERROR).
        std::lock_guard lock(declare_mutex_);
        conn.DeclareQueue(options_.queue, options_.queue_type);
        conn.DeclareQueue(options_.queue + ".dead", options_.queue_type);
        conn.Confirm();
        conn.Prefetch(1);
        conn.Consume(options_.queue);
      }
      consuming = true;
      if (failures > 0 && reconnects_ != nullptr) reconnects_->Inc();
      common::Log(options_.log_name + "_connected", {{"queue", options_.queue},
                                                     {"consumer", std::to_string(index)},
                                                     {"node", Address(url)},
                                                     {"after_failures", std::to_string(failures)}});
      failures = 0;
      while (!stopping_) {
        if (auto d = conn.Next(std::chrono::milliseconds(200))) handle_(conn, *d);
      }
      return;
    } catch (const std::exception& e) {
      // The node went away, or anything else failed with a message in hand (which goes back
      // to the queue with the connection): connect again, to the next node, rather than end
      // the thread, or the process (an exception leaving a std::thread is std::terminate).
      common::Log(options_.log_name + "_disconnected", {{"queue", options_.queue},
                                                        {"consumer", std::to_string(index)},
                                                        {"node", Address(url)},
                                                        {"consuming", consuming ? "true" : "false"},
                                                        {"error", e.what()}});
      ++failures;
      node = (node + 1) % nodes;
      // A dead node is passed over at the first backoff, while a cluster that is down as a
      // whole is asked less and less often: doubled each time round the list.
      auto backoff = options_.reconnect_backoff;
      for (int round = (failures - 1) / static_cast<int>(nodes);
           round > 0 && backoff < options_.max_reconnect_backoff; --round) {
        backoff *= 2;
      }
      backoff = std::min(backoff, options_.max_reconnect_backoff);
      auto half = backoff / 2;
      Pause(half + std::chrono::milliseconds(jitter() % (half.count() + 1)));
    }
  }
}

Message Reply(const Message& request, const ReplyParts& answer) {
  Message reply;
  reply.correlation_id = request.correlation_id;
  reply.body = answer.body;
  reply.content_type = answer.content_type;
  reply.headers = answer.headers;
  reply.headers["status"] = std::to_string(answer.status);
  return reply;
}

Message DeadLetter(const Message& request, int status, const std::string& code,
                   const std::string& detail) {
  Message dead = request;
  std::erase_if(dead.headers, [](const auto& h) { return IEquals(h.first, "Authorization"); });
  dead.headers["x-idemsaga-status"] = std::to_string(status);
  dead.headers["x-idemsaga-error"] = code;
  dead.headers["x-idemsaga-detail"] = detail;
  return dead;
}

bool Named(const Message& m, const char* name) {
  return std::any_of(m.headers.begin(), m.headers.end(),
                     [&](const auto& h) { return IEquals(h.first, name); }) ||
         std::any_of(m.other_headers.begin(), m.other_headers.end(),
                     [&](const auto& h) { return IEquals(h.first, name); });
}

std::string First(const Message& m, const char* name) {
  for (const auto& [n, v] : m.headers) {
    if (IEquals(n, name)) return v;
  }
  return "";
}

std::optional<std::string> OneHeader(const Message& m, const char* name) {
  std::vector<const std::string*> values;
  for (const auto& [n, v] : m.headers) {
    if (IEquals(n, name)) values.push_back(&v);
  }
  bool other = std::any_of(m.other_headers.begin(), m.other_headers.end(),
                           [&](const auto& h) { return IEquals(h.first, name); });
  if (values.size() != 1 || other) return std::nullopt;
  return *values[0];
}

std::pair<size_t, std::string> KeyHeader(const Message& m) {
  size_t lines = 0;
  std::string first;
  for (const auto& [name, value] : m.headers) {
    if (IEquals(name, "Idempotency-Key") && lines++ == 0) first = value;
  }
  for (const auto& [name, kind] : m.other_headers) {
    if (IEquals(name, "Idempotency-Key") && lines++ == 0) first = "(" + std::string(1, kind) + ")";
  }
  return {lines, first};
}

}  // namespace idemsaga::common::amqp
