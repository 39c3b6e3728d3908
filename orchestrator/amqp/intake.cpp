#include "orchestrator/amqp/intake.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "common/http/problem.hpp"
#include "common/http/request_parser.hpp"
#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "orchestrator/amqp/connection.hpp"

namespace orchestrator::amqp {
namespace {

// Header names match as HTTP's do: in any case.
using common::http::detail::IEquals;

// The one string value of the header `name` (in any case) of an event's message; nullopt
// after answering 400 when it is missing, empty, not a string, or given twice.
std::optional<std::string> TargetHeader(const Message& m, const char* name,
                                        httplib::Response& refusal) {
  std::vector<const std::string*> values;
  for (const auto& [n, v] : m.headers) {
    if (IEquals(n, name)) values.push_back(&v);
  }
  bool other = std::any_of(m.other_headers.begin(), m.other_headers.end(),
                           [&](const auto& h) { return IEquals(h.first, name); });
  if (values.size() == 1 && !other && !values[0]->empty()) return *values[0];
  common::http::SetError(
      refusal, 400, "invalid_request",
      values.empty() && !other
          ? std::string("an event's message names its run in the headers saga, run and event: `") +
                name + "` is missing"
          : std::string("the header `") + name + "` must be one non-empty string");
  return std::nullopt;
}

// A path segment as the server hands a route's capture: only `/` and `%` stay encoded, so
// the route's decode gives the value's bytes back, whatever they are.
std::string Segment(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The path of the route the message stands for: POST /v1/orders, a run's /v1/runs/{saga}
// (the header `saga`), or an event's
// /v1/runs/{saga}/{run}/events/{event} from its headers (the run's key as its raw bytes).
// nullopt after answering `refusal` when an event's message does not name its target.
std::optional<std::string> RoutePath(const Message& m, Carries carries,
                                     httplib::Response& refusal) {
  if (carries == Carries::kOrders) {
    // A run of any served saga names it in the header `saga`; without one, an order.
    bool named = std::any_of(m.headers.begin(), m.headers.end(),
                             [](const auto& h) { return IEquals(h.first, "saga"); }) ||
                 std::any_of(m.other_headers.begin(), m.other_headers.end(),
                             [](const auto& h) { return IEquals(h.first, "saga"); });
    if (!named) return "/v1/orders";
    auto saga = TargetHeader(m, "saga", refusal);
    if (!saga) return std::nullopt;
    return "/v1/runs/" + Segment(*saga);
  }
  auto saga = TargetHeader(m, "saga", refusal);
  if (!saga) return std::nullopt;
  auto run = TargetHeader(m, "run", refusal);
  if (!run) return std::nullopt;
  auto event = TargetHeader(m, "event", refusal);
  if (!event) return std::nullopt;
  return "/v1/runs/" + Segment(*saga) + "/" + Segment(*run) + "/events/" + Segment(*event);
}

// The HTTP request the message stands for: POST `path` with the message's body and the
// headers the route reads. Header names are matched as HTTP matches them (any case); every
// match is passed on, so a key given twice is refused as it would be over HTTP.
httplib::Request ToRequest(const Message& m, std::string path) {
  httplib::Request req;
  req.method = "POST";
  req.path = std::move(path);
  req.body = m.body;
  bool has_key = false;
  for (const auto& [name, value] : m.headers) {
    for (const char* wanted : {"Authorization", "Idempotency-Key", "traceparent"}) {
      if (!IEquals(name, wanted)) continue;
      req.headers.emplace(wanted, value);
      has_key |= IEquals(name, "Idempotency-Key");
    }
  }
  for (const auto& [name, kind] : m.other_headers) {
    // A key that is not a string (a number, a table) is no key: an sf-string of it would be
    // a guess. Passed on as something the route refuses as a bad key.
    if (IEquals(name, "Idempotency-Key")) {
      req.headers.emplace("Idempotency-Key", "(" + std::string(1, kind) + ")");
      has_key = true;
    }
  }
  // The message id is the key's bytes as they are, so it travels as an sf-string.
  if (!has_key && !m.message_id.empty()) {
    req.headers.emplace("Idempotency-Key", common::FormatIdempotencyKey(m.message_id));
  }
  req.headers.emplace("Content-Type",
                      m.content_type.empty() ? std::string("application/json") : m.content_type);
  return req;
}

Message Reply(const Message& request, const httplib::Response& res) {
  Message reply;
  reply.correlation_id = request.correlation_id;
  reply.body = res.body;
  reply.content_type = res.get_header_value("Content-Type");
  for (const auto& [name, value] : res.headers) {
    if (!IEquals(name, "Content-Type")) reply.headers[name] = value;
  }
  reply.headers["status"] = std::to_string(res.status);
  return reply;
}

// The message as it came, minus the tenant's credential (a dead-letter queue is read by
// operators, not tenants), with why it was refused.
Message DeadLetterMessage(const Message& m, const httplib::Response& res) {
  Message dead = m;
  std::erase_if(dead.headers, [](const auto& h) { return IEquals(h.first, "Authorization"); });
  auto [code, detail] = common::http::ErrorOf(nlohmann::json::parse(res.body, nullptr, false));
  dead.headers["x-idemsaga-status"] = std::to_string(res.status);
  dead.headers["x-idemsaga-error"] = code;
  dead.headers["x-idemsaga-detail"] = detail;
  return dead;
}

}  // namespace

Intake::Intake(IntakeOptions options, Submit submit, common::metrics::Registry* metrics)
    : options_(std::move(options)), submit_(std::move(submit)) {
  CheckUrl(options_.url);
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
    httplib::Response refusal;
    auto path = RoutePath(m, intake_.options_.carries, refusal);
    if (!path) return DeadLetter(d, refusal);
    httplib::Request req = ToRequest(m, std::move(*path));
    auto deadline = std::chrono::steady_clock::now() + intake_.options_.max_wait;
    auto wait = std::chrono::milliseconds(100);
    bool logged_outage = false;
    for (;;) {
      httplib::Response res;
      std::optional<KeyOutcome> outcome;
      try {
        outcome = intake_.submit_(req, res);
      } catch (...) {
        auto failure = common::http::SetFailure(res, std::current_exception(),
                                                  intake_.options_.classify);
        if (failure.kind != common::pg::Failure::kUnavailable) {
          // Not an outage (a value the database refused, a defect): asking again fails the
          // same way, so the message is dead-lettered with the 500 below.
          common::Log(Event("failed"), {{"queue", intake_.options_.queue},
                                        {"sqlstate", failure.sqlstate},
                                        {"error", failure.what}});
          outcome = KeyOutcome::kNone;
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
      bool unavailable = !outcome || (*outcome == KeyOutcome::kNone && res.status == 503);
      if (!unavailable && (*outcome == KeyOutcome::kNone || *outcome == KeyOutcome::kMismatch)) {
        return DeadLetter(d, res);
      }
      // Whatever status the saga's stored answer has (a 502 `<step>_unavailable` included),
      // it is final: replayed to every later copy of the message. An order's 202 is a saga
      // still running; an event's 202 is its stored answer, final.
      bool running = outcome == KeyOutcome::kInProgress ||
                     (intake_.options_.carries == Carries::kOrders && res.status == 202);
      if (!unavailable && !running) {
        if (!m.reply_to.empty()) conn_.Publish(m.reply_to, Reply(m, res));
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
  void DeadLetter(const Delivery& d, const httplib::Response& res) {
    const Message& m = d.message;
    // Mandatory: a dead-letter queue deleted meanwhile fails the publish (the message is
    // then redelivered and the queue declared again), never loses the message.
    conn_.Publish(intake_.options_.queue + ".dead", DeadLetterMessage(m, res), true);
    if (!m.reply_to.empty()) conn_.Publish(m.reply_to, Reply(m, res));
    conn_.Ack(d.tag);
    common::Log(Event("dead_lettered"), {{"queue", intake_.options_.queue},
                                         {"status", std::to_string(res.status)},
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
  while (!stopping_) {
    try {
      Connection conn(options_.url);
      conn.DeclareQueue(options_.queue);
      conn.DeclareQueue(options_.queue + ".dead");
      conn.Confirm();
      conn.Prefetch(1);
      conn.Consume(options_.queue);
      Consumer consumer(*this, conn);
      while (!stopping_) {
        if (auto d = conn.Next(std::chrono::milliseconds(200))) consumer.Handle(*d);
      }
      return;
    } catch (const std::exception& e) {
      // The broker went away, or anything else failed with a message in hand (which goes
      // back to the queue with the connection): connect again rather than end the thread,
      // or the process (an exception leaving a std::thread is std::terminate).
      common::Log(
          "amqp_intake_disconnected",
          {{"queue", options_.queue}, {"consumer", std::to_string(index)}, {"error", e.what()}});
      Pause(options_.reconnect_backoff);
    }
  }
}

}  // namespace orchestrator::amqp
