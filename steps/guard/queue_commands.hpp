// A participant's guarded routes served from a RabbitMQ queue as well as over HTTP
// (docs/messaging.md is the wire contract): each message is a POST to the route its header
// `path` names, with the message's headers (Idempotency-Key, X-Tenant-ID, Authorization,
// traceparent) and body as the request's, handed to that route's own handler (HttpGuard's:
// the same checks in the same order, the same guard and store, the same metrics and spans).
// Its answer, byte for byte what HTTP answers, is published to the message's reply_to with
// its correlation_id, confirmed, and only then is the message acknowledged: a crash before
// the ack redelivers it and the guard replays the stored answer.
//
// What the answer says decides the rest: a command refused before anything was stored (the
// edge's 4xx: no such route, token, tenant, key, body, validate; a key reused with another
// body; a 500 that is not an outage) is also dead-lettered to `<queue>.dead` with the reason;
// a first answer that asks to come back (Retry-After: 503 outage, 409 in progress) keeps the
// message in hand and asks again, up to max_wait, then requeues it; anything else (a success,
// a stored business refusal, a replay) is final. A route that drops its answer
// (common::http::CloseWithoutResponse: a fault injected "after commit") drops the consumer's
// connection, as a crash would: the broker redelivers and the redelivery replays.
//
// Routes are matched by their literal path (a participant's routes are plain paths, not
// patterns). Thread-safe: Start() once, Stop() from any thread; handlers run on the
// consumers' threads, as they run on the server's.
//   QueueCommands commands({.urls = {url}, .queue = "shipping"}, {{"/v1/shipments", handler}});
//   commands.Start(); ...; commands.Stop();
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/amqp/consumers.hpp"
#include "common/failure.hpp"
#include "common/http/server.hpp"
#include "common/metrics.hpp"

namespace idemsaga::steps::guard {

struct QueueCommandsOptions {
  std::vector<std::string> urls;  // amqp://..., one per node of a cluster
  std::string queue;              // its refused messages go to `<queue>.dead`
  common::amqp::QueueType queue_type = common::amqp::QueueType::kClassic;
  int consumers = 2;
  std::chrono::milliseconds max_wait{std::chrono::minutes(2)};
  // What a handler's exception means (the server's classifier); empty: common::ClassifyPlain.
  common::FailureClassifier classify;
};

// "classic" or "quorum" (any case); nullopt otherwise.
std::optional<common::amqp::QueueType> ParseQueueType(const std::string& name);

class QueueCommands {
 public:
  using Routes = std::map<std::string, common::http::Server::Handler>;  // path -> POST handler

  // Throws std::invalid_argument for no URL or one that is not amqp://... Counts messages in
  // `metrics` (may be null): idemsaga_amqp_commands_total{queue,outcome}, outcome replied,
  // dead_lettered, requeued or redelivered; idemsaga_amqp_reconnects_total{queue}.
  QueueCommands(QueueCommandsOptions options, Routes routes,
                common::metrics::Registry* metrics = nullptr);
  ~QueueCommands();

  void Start();
  void Stop();

 private:
  void Handle(common::amqp::Connection& conn, const common::amqp::Delivery& d);
  void Count(const char* outcome);

  QueueCommandsOptions options_;
  Routes routes_;
  common::metrics::Family<common::metrics::Counter>* messages_ = nullptr;
  std::optional<common::amqp::Consumers> consumers_;
};

}  // namespace idemsaga::steps::guard
