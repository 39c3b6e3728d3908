#include "orchestrator/amqp/intake.hpp"

#include <algorithm>
#include <optional>
#include <random>

#include "common/failure.hpp"
#include "common/http/problem.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/amqp/connection.hpp"
#include "orchestrator/http/answers.hpp"

namespace idemsaga::orchestrator::amqp {
namespace {

// Header names match as HTTP's do: in any case.
using common::IEquals;
using common::http::Answer;

// A message's answer (HTTP's, orchestrator/http/answers.hpp), and what its key said: kNone
// when it was refused before the key was consulted (nothing stored).
struct Answered {
  Answer answer;
  KeyOutcome outcome = KeyOutcome::kNone;
};

bool Named(const Message& m, const char* name) {
  return std::any_of(m.headers.begin(), m.headers.end(),
                     [&](const auto& h) { return IEquals(h.first, name); }) ||
         std::any_of(m.other_headers.begin(), m.other_headers.end(),
                     [&](const auto& h) { return IEquals(h.first, name); });
}

// The first string value of the header `name` (in any case), as a route reads a header given
// twice; "" when there is none.
std::string First(const Message& m, const char* name) {
  for (const auto& [n, v] : m.headers) {
    if (IEquals(n, name)) return v;
  }
  return "";
}

// The one string value of the header `name` (in any case) that names a message's target;
// nullopt, with the refusal in `refused`, when it is missing, empty, not a string, or given
// twice.
std::optional<std::string> TargetHeader(const Message& m, const char* name, Answered& refused) {
  std::vector<const std::string*> values;
  for (const auto& [n, v] : m.headers) {
    if (IEquals(n, name)) values.push_back(&v);
  }
  bool other = std::any_of(m.other_headers.begin(), m.other_headers.end(),
                           [&](const auto& h) { return IEquals(h.first, name); });
  if (values.size() == 1 && !other && !values[0]->empty()) return *values[0];
  refused.answer = common::http::ProblemAnswer(
      400, "invalid_request",
      values.empty() && !other
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
  size_t lines = 0;
  std::string first;
  for (const auto& [name, value] : m.headers) {
    if (IEquals(name, "Idempotency-Key") && lines++ == 0) first = value;
  }
  for (const auto& [name, kind] : m.other_headers) {
    if (IEquals(name, "Idempotency-Key") && lines++ == 0) first = "(" + std::string(1, kind) + ")";
  }
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

Message Reply(const Message& request, const Answer& answer) {
  Message reply;
  reply.correlation_id = request.correlation_id;
  reply.body = answer.body;
  reply.content_type = answer.content_type;
  reply.headers = answer.headers;
  reply.headers["status"] = std::to_string(answer.status);
  return reply;
}

// The message as it came, minus the tenant's credential (a dead-letter queue is read by
// operators, not tenants), with why it was refused.
Message DeadLetterMessage(const Message& m, const Answer& answer) {
  Message dead = m;
  std::erase_if(dead.headers, [](const auto& h) { return IEquals(h.first, "Authorization"); });
  auto [code, detail] = common::http::ErrorOf(nlohmann::json::parse(answer.body, nullptr, false));
  dead.headers["x-idemsaga-status"] = std::to_string(answer.status);
  dead.headers["x-idemsaga-error"] = code;
  dead.headers["x-idemsaga-detail"] = detail;
  return dead;
}

}  // namespace

Intake::Intake(IntakeOptions options, IntakeServices services, common::metrics::Registry* metrics)
    : options_(std::move(options)), services_(std::move(services)) {
  if (options_.urls.empty()) throw std::invalid_argument("--amqp-url names no broker");
  for (const auto& url : options_.urls) CheckUrl(url);
  if (metrics == nullptr) return;
  reconnects_ = &metrics
                     ->Counter("idemsaga_amqp_reconnects_total",
                               "Consumers connected, to the same or the next broker node, after a "
                               "connection that broke or could not be made.",
                               {"queue"})
                     .With({options_.queue});
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
  for (int i = 0; i < options_.consumers; ++i) threads_.emplace_back([this, i] { Run(i); });
  common::Log("amqp_intake_started", {{"queue", options_.queue},
                                      {"carries", Kind()},
                                      {"consumers", std::to_string(options_.consumers)}});
}

void Intake::Stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void Intake::Count(const char* outcome) {
  if (messages_ != nullptr) messages_->With({outcome}).Inc();
}

bool Intake::Pause(std::chrono::milliseconds d) {
  std::unique_lock lock(mutex_);
  return !cv_.wait_for(lock, d, [this] { return stopping_.load(); });
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
        if (!m.reply_to.empty()) conn_.Publish(m.reply_to, Reply(m, answered->answer));
        conn_.Ack(d.tag);
        intake_.Count("replied");
        return;
      }
      // Its saga goes on (here after a 202, or in a process that died and whose lease
      // recovery takes over), or the database is away: ask again until the answer is final.
      // A saga that outlives max_wait goes back to the queue and is asked about later.
      if (intake_.stopping_ || (running && std::chrono::steady_clock::now() + wait > deadline)) {
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
    conn_.Publish(intake_.options_.queue + ".dead", DeadLetterMessage(m, answer), true);
    if (!m.reply_to.empty()) conn_.Publish(m.reply_to, Reply(m, answer));
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

void Intake::Run(int index) {
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
      common::Log("amqp_intake_connected", {{"queue", options_.queue},
                                            {"consumer", std::to_string(index)},
                                            {"node", Address(url)},
                                            {"after_failures", std::to_string(failures)}});
      failures = 0;
      Consumer consumer(*this, conn);
      while (!stopping_) {
        if (auto d = conn.Next(std::chrono::milliseconds(200))) consumer.Handle(*d);
      }
      return;
    } catch (const std::exception& e) {
      // The node went away, or anything else failed with a message in hand (which goes back
      // to the queue with the connection): connect again, to the next node, rather than end
      // the thread, or the process (an exception leaving a std::thread is std::terminate).
      common::Log("amqp_intake_disconnected", {{"queue", options_.queue},
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

}  // namespace idemsaga::orchestrator::amqp
