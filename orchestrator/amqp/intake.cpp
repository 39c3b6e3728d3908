#include "orchestrator/amqp/intake.hpp"

#include <algorithm>
#include <optional>

#include "common/amqp/connection.hpp"
#include "common/failure.hpp"
#include "common/http/problem.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "orchestrator/http/answers.hpp"

namespace idemsaga::orchestrator::amqp {
namespace {

// Header names match as HTTP's do: in any case.
using common::IEquals;
using common::amqp::First;
using common::amqp::Named;
using common::http::Answer;

// A message's answer (HTTP's, orchestrator/http/answers.hpp), and what its key said: kNone
// when it was refused before the key was consulted (nothing stored).
struct Answered {
  Answer answer;
  KeyOutcome outcome = KeyOutcome::kNone;
};

// The one string value of the header `name` (in any case) that names a message's target;
// nullopt, with the refusal in `refused`, when it is missing, empty, not a string, or given
// twice.
std::optional<std::string> TargetHeader(const Message& m, const char* name, Answered& refused) {
  auto value = common::amqp::OneHeader(m, name);
  if (value && !value->empty()) return value;
  refused.answer = common::http::ProblemAnswer(
      400, "invalid_request",
      !Named(m, name)
          ? std::string("an event's message names its run in the headers saga, run and event: `") +
                name + "` is missing"
          : std::string("the header `") + name + "` must be one non-empty string");
  return std::nullopt;
}

// The message's Idempotency-Key, read as a route reads its header: every header of that name
// (in any case) counts, so a key given twice is refused as it is over HTTP; a key that is not
// a string (a number, a table) is no key (an sf-string of it would be a guess) and is refused
// as a bad one; without any, the message id is the key's bytes as they are.
common::ParsedKey MessageKey(const Message& m) {
  auto [lines, first] = common::amqp::KeyHeader(m);
  if (lines == 0 && !m.message_id.empty()) {
    lines = 1;
    first = common::FormatIdempotencyKey(m.message_id);
  }
  return common::ParseIdempotencyKey(lines, first, kMaxParentKeyLength);
}

common::JsonBody Body(const Message& m, const common::JsonLimits& limits) {
  return common::ReadJsonBody(m.content_type.empty() ? "application/json" : m.content_type, m.body,
                              limits);
}

Answered Refused(const common::InputRefusal& r) {
  return {common::http::ProblemAnswer(r.status, r.code, r.detail)};
}

// An order (no header `saga`: POST /v1/orders), or a run of the saga the header `saga` names
// (POST /v1/runs/{saga}), refused in the order the route refuses.
Answered StartRun(const IntakeServices& s, const Message& m) {
  Answered refused;
  std::optional<std::string> saga;
  if (Named(m, "saga")) {
    saga = TargetHeader(m, "saga", refused);
    if (!saga) return refused;
  }
  const bool as_order = !saga && s.runs.Serves(kOrderSaga);
  auto tenant = s.auth(common::BearerTokenOf(First(m, "Authorization")));
  if (!tenant) return {http::UnauthorizedRunAnswer()};
  // Which sagas are served is for a known caller only.
  if (!as_order && (!saga || !s.runs.Serves(*saga))) {
    RunOutcome unknown;
    unknown.kind = RunOutcome::Kind::kUnknownSaga;
    return {http::RunAnswer(unknown, "", "")};
  }
  auto key = MessageKey(m);
  if (!key.ok()) return {common::http::ProblemAnswer(400, key.error, key.message)};
  auto body = Body(m, s.json);
  if (!body.value) return Refused(body.refusal);
  const std::string name = as_order ? std::string(kOrderSaga) : *saga;
  RunOutcome outcome = s.runs.Start({.saga = name,
                                     .tenant_id = *tenant,
                                     .key = key.key,
                                     .input = std::move(*body.value),
                                     .traceparent = First(m, "traceparent"),
                                     .as_order = as_order});
  return {http::RunAnswer(outcome, name, key.key), outcome.outcome};
}

// An event for the run its headers `saga`, `run` (the run's key, its bytes as they are) and
// `event` name (POST /v1/runs/{saga}/{run}/events/{event}), refused in the route's order.
Answered DeliverEvent(const IntakeServices& s, const Message& m) {
  Answered refused;
  auto saga = TargetHeader(m, "saga", refused);
  if (!saga) return refused;
  auto run = TargetHeader(m, "run", refused);
  if (!run) return refused;
  auto event = TargetHeader(m, "event", refused);
  if (!event) return refused;
  auto tenant = s.auth(common::BearerTokenOf(First(m, "Authorization")));
  if (!tenant) return {http::UnauthorizedAnswer()};
  auto target =
      s.events.Find({.tenant_id = *tenant, .saga = *saga, .run_key = *run, .event = *event});
  if (!target.Found()) return {http::EventAnswer(target.refused)};
  auto key = MessageKey(m);
  if (!key.ok()) return {common::http::ProblemAnswer(400, key.error, key.message)};
  auto body = Body(m, s.json);
  if (!body.value) return Refused(body.refusal);
  EventOutcome outcome = s.events.Deliver(target, key.key, *body.value);
  return {http::EventAnswer(outcome), outcome.Key()};
}

common::amqp::ReplyParts Parts(const Answer& answer) {
  return {answer.status, answer.content_type, answer.headers, answer.body};
}

}  // namespace

Intake::Intake(IntakeOptions options, IntakeServices services, common::metrics::Registry* metrics)
    : options_(std::move(options)), services_(std::move(services)) {
  consumers_.emplace(
      common::amqp::ConsumersOptions{.urls = options_.urls,
                                     .queue = options_.queue,
                                     .queue_type = options_.queue_type,
                                     .consumers = options_.consumers,
                                     .reconnect_backoff = options_.reconnect_backoff,
                                     .max_reconnect_backoff = options_.max_reconnect_backoff,
                                     .log_name = "amqp_intake"},
      [this](Connection& conn, const Delivery& d) { Handle(conn, d); }, metrics);
  if (metrics == nullptr) return;
  if (options_.carries == Carries::kOrders) {
    messages_ = &metrics->Counter(
        "idemsaga_amqp_messages_total",
        "Order messages taken from the queue, by what became of them: replied (final answer "
        "published, acked), dead_lettered, requeued (stopping, or a saga that outlived "
        "--amqp-max-wait-ms); redelivered counts deliveries the broker had handed out before.",
        {"outcome"});
  } else {
    messages_ = &metrics->Counter(
        "idemsaga_amqp_event_messages_total",
        "Event messages taken from the events queue, by what became of them: replied (stored "
        "or replayed, answer published, acked), dead_lettered, requeued (stopping during a "
        "database outage); redelivered counts deliveries the broker had handed out before.",
        {"outcome"});
  }
}

const char* Intake::Kind() const {
  return options_.carries == Carries::kOrders ? "order" : "event";
}

Intake::~Intake() { Stop(); }

void Intake::Start() {
  consumers_->Start();
  common::Log("amqp_intake_started", {{"queue", options_.queue},
                                      {"carries", Kind()},
                                      {"consumers", std::to_string(options_.consumers)}});
}

void Intake::Stop() { consumers_->Stop(); }

void Intake::Count(const char* outcome) {
  if (messages_ != nullptr) messages_->With({outcome}).Inc();
}

// One consumer: a connection of its own, one message in hand at a time.
class Intake::Consumer {
 public:
  Consumer(Intake& intake, Connection& conn) : intake_(intake), conn_(conn) {}

  void Handle(const Delivery& d) {
    if (d.redelivered) intake_.Count("redelivered");
    const Message& m = d.message;
    const bool orders = intake_.options_.carries == Carries::kOrders;
    auto deadline = std::chrono::steady_clock::now() + intake_.options_.max_wait;
    auto wait = std::chrono::milliseconds(100);
    bool logged_outage = false;
    for (;;) {
      std::optional<Answered> answered;
      try {
        answered = orders ? StartRun(intake_.services_, m) : DeliverEvent(intake_.services_, m);
      } catch (...) {
        const auto& classify = intake_.options_.classify;
        auto failure = classify ? classify(std::current_exception())
                                : common::ClassifyPlain(std::current_exception());
        if (failure.kind != common::Failure::kUnavailable) {
          // Not an outage (a value the database refused, a defect): asking again fails the
          // same way, so the message is dead-lettered with the 500 a route would answer.
          common::Log(Event("failed"), {{"queue", intake_.options_.queue},
                                        {"sqlstate", failure.sqlstate},
                                        {"error", failure.what}});
          answered = Answered{common::http::FailureAnswer(failure)};
        } else if (!logged_outage) {
          common::Log(Event("unavailable"),
                      {{"queue", intake_.options_.queue}, {"error", failure.what}});
          logged_outage = true;
        }
      }
      // Nothing answered (the database failed), or refused before the key was consulted with
      // "try again" (503 while shutting down): asked again, with the message kept in hand
      // rather than requeued, since a requeue counts against a quorum queue's delivery-limit
      // and an outage must not use it up.
      bool unavailable =
          !answered || (answered->outcome == KeyOutcome::kNone && answered->answer.status == 503);
      if (!unavailable &&
          (answered->outcome == KeyOutcome::kNone || answered->outcome == KeyOutcome::kMismatch)) {
        return DeadLetter(d, answered->answer);
      }
      // Whatever status the saga's stored answer has (a 502 `<step>_unavailable` included),
      // it is final: replayed to every later copy of the message. An order's 202 is a saga
      // still running; an event's 202 is its stored answer, final.
      bool running = !unavailable && (answered->outcome == KeyOutcome::kInProgress ||
                                      (orders && answered->answer.status == 202));
      if (!unavailable && !running) {
        if (!m.reply_to.empty())
          conn_.Publish(m.reply_to, common::amqp::Reply(m, Parts(answered->answer)));
        conn_.Ack(d.tag);
        intake_.Count("replied");
        return;
      }
      // Its saga goes on (here after a 202, or in a process that died and whose lease
      // recovery takes over), or the database is away: ask again until the answer is final.
      // A saga that outlives max_wait goes back to the queue and is asked about later.
      if (intake_.consumers_->stopping() ||
          (running && std::chrono::steady_clock::now() + wait > deadline)) {
        return Requeue(d);
      }
      conn_.Idle(wait);
      wait = std::min(wait * 2, std::chrono::milliseconds(2000));
    }
  }

 private:
  // The log event "amqp_<order|event>_<what>".
  std::string Event(const char* what) const {
    return std::string("amqp_") + intake_.Kind() + "_" + what;
  }

  // Refused for good: to `<queue>.dead` with the reason, the refusal replied, acked.
  void DeadLetter(const Delivery& d, const Answer& answer) {
    const Message& m = d.message;
    // Mandatory: a dead-letter queue deleted meanwhile fails the publish (the message is
    // then redelivered and the queue declared again), never loses the message.
    auto [code, detail] = common::http::ErrorOf(nlohmann::json::parse(answer.body, nullptr, false));
    conn_.Publish(intake_.options_.queue + ".dead",
                  common::amqp::DeadLetter(m, answer.status, code, detail), true);
    if (!m.reply_to.empty()) conn_.Publish(m.reply_to, common::amqp::Reply(m, Parts(answer)));
    conn_.Ack(d.tag);
    common::Log(Event("dead_lettered"), {{"queue", intake_.options_.queue},
                                         {"status", std::to_string(answer.status)},
                                         {"message_id", m.message_id}});
    intake_.Count("dead_lettered");
  }

  void Requeue(const Delivery& d) {
    conn_.Reject(d.tag, true);
    intake_.Count("requeued");
  }

  Intake& intake_;
  Connection& conn_;
};

void Intake::Handle(Connection& conn, const Delivery& d) { Consumer(*this, conn).Handle(d); }

}  // namespace idemsaga::orchestrator::amqp
