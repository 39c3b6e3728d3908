// Orders, or external events, from a RabbitMQ queue: an adapter over the use cases ("start a
// run", RunStarter; "deliver an event", EventReceiver), each message read as the HTTP route
// reads its request (the same checks in the same order, the same key and fingerprint) and
// answered with the HTTP adapter's answer (orchestrator/http/answers.hpp), byte for byte:
// - runs (Carries::kOrders): a message is an order as POST /v1/orders takes it (the body;
//   `Idempotency-Key` and `Authorization: Bearer <API key>` as headers), or, with the string
//   header `saga`, a run of that saga as POST /v1/runs/{saga} takes it;
// - events (Carries::kEvents): a message is an event as POST
//   /v1/runs/{saga}/{key}/events/{name} takes it (the body is the payload; the same two
//   headers, the key being the event's own), with its target in the string headers `saga`,
//   `run` (the run's Idempotency-Key, its bytes as they are: no quoting, no escapes) and
//   `event`.
// Either key falls back to the message id.
//
// A message is acknowledged only once its answer is final and published to the message's
// `reply_to` (with its `correlation_id`), so every crash before the ack redelivers it, and
// the redelivery finds the key: it replays the stored answer (or waits for the saga still
// running under it), never a second saga or a second event. A reply may therefore come
// twice, byte for byte the same. A message refused before its key is stored (bad JSON, a
// missing or bad key, an unknown tenant, an invalid order or payload, an event's missing
// target or one its run does not await) or whose key was used for another request goes to
// the dead-letter queue `<queue>.dead` with the reason in its headers (without the
// Authorization header), and is answered on `reply_to` with the error. A saga's stored answer
// is final whatever its status (a 502 of a step that stayed down too); an event's 202 is
// final. During a database outage the message stays in hand and is asked about again: a
// requeue would count against a quorum queue's delivery-limit.
//
// Each consumer is one connection with a prefetch of one: at most `consumers` messages are
// in hand at once, so a slow database slows consumption instead of piling work up here. A
// consumer whose connection breaks (its node died, say) connects to the next node of
// `urls`; the message it had in hand goes back to the queue with the dead connection, and its
// redelivery finds the key as above.
//
// Thread-safe: Start() once, Stop() from any thread.
//   amqp::Intake intake({.urls = {url}, .queue = "orders"},
//                       {orch.runs(), orch.events(), orch.auth(), {.max_bytes = 65536}});
//   intake.Start(); ...; intake.Stop();
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/amqp/connection.hpp"
#include "common/amqp/consumers.hpp"
#include "common/failure.hpp"
#include "common/metrics.hpp"
#include "common/request_input.hpp"
#include "orchestrator/receive_event.hpp"
#include "orchestrator/start_run.hpp"
#include "orchestrator/tenant_auth.hpp"

namespace idemsaga::orchestrator::amqp {

// The connection is common (participants consume commands over it too).
using common::amqp::Address;
using common::amqp::AmqpError;
using common::amqp::CheckUrl;
using common::amqp::Connection;
using common::amqp::Delivery;
using common::amqp::Message;
using common::amqp::QueueType;

// What a queue's messages are, and so which route they stand for.
enum class Carries {
  kOrders,  // POST /v1/orders
  kEvents,  // POST /v1/runs/{saga}/{key}/events/{name}
};

struct IntakeOptions {
  // amqp://user:password@host:port/vhost, one per node of a cluster. Every consumer connects
  // to the first; when its connection breaks it connects to the next, round the list.
  std::vector<std::string> urls;
  std::string queue = "orders";
  // Of the queue and its dead-letter queue, when they are declared here (an existing queue is
  // used as it is). kQuorum on a cluster: a classic queue lives on one node and is
  // unavailable, with its messages, while that node is down.
  QueueType queue_type = QueueType::kClassic;
  Carries carries = Carries::kOrders;
  int consumers = 4;
  // How long a message waits in hand for its saga (a 202, or a saga another process runs)
  // before it goes back to the queue to be tried again later.
  std::chrono::milliseconds max_wait{std::chrono::minutes(2)};
  // How long to wait before connecting again after the broker went away: the first time
  // round the list of nodes, doubled each time round after, up to max_reconnect_backoff
  // (with jitter, so that the consumers of a process do not knock in step).
  std::chrono::milliseconds reconnect_backoff{500};
  std::chrono::milliseconds max_reconnect_backoff{8000};
  // What a failure of `submit` means (its stores' classifier, common::pg::Classify for the
  // orchestrator's); empty: common::ClassifyPlain.
  common::FailureClassifier classify;
};

// What the intake adapts (the Orchestrator's): the use cases, who a caller is, and the
// limits a message's JSON body is read under (the HTTP server's).
struct IntakeServices {
  const RunStarter& runs;
  const EventReceiver& events;
  TenantAuth& auth;
  common::JsonLimits json;
};

class Intake {
 public:
  // Throws std::invalid_argument for no URL or one that is not amqp://... Counts messages in
  // `metrics` (may be null), in idemsaga_amqp_messages_total{outcome} for orders and
  // idemsaga_amqp_event_messages_total{outcome} for events: replied (final answer published,
  // acked), dead_lettered, requeued (stopping, or a saga that outlived max_wait), and
  // redelivered (deliveries the broker marked as seen before); and consumers connected again
  // after a broken connection in idemsaga_amqp_reconnects_total{queue}.
  Intake(IntakeOptions options, IntakeServices services,
         common::metrics::Registry* metrics = nullptr);
  ~Intake();

  void Start();
  // Stops consuming; messages in hand whose answer is not final go back to the queue.
  void Stop();

 private:
  class Consumer;
  void Handle(Connection& conn, const Delivery& d);
  void Count(const char* outcome);
  const char* Kind() const;  // "order" or "event", in log events

  IntakeOptions options_;
  IntakeServices services_;
  common::metrics::Family<common::metrics::Counter>* messages_ = nullptr;
  std::optional<common::amqp::Consumers> consumers_;
};

}  // namespace idemsaga::orchestrator::amqp
