// POST /v1/runs/{saga}/{key}/events/{name}: an external event for one saga run (a payment
// provider's webhook, an approval), under its own Idempotency-Key. The HTTP adapter of the
// "deliver an event" use case (orchestrator/receive_event.hpp), which the AMQP intake's
// events queue calls too; EventAnswer renders its outcome for both.
#include "common/idempotency_key.hpp"
#include "orchestrator/http/answers.hpp"
#include "orchestrator/http/routes.hpp"

namespace idemsaga::orchestrator::http {

using common::http::ProblemAnswer;

Answer EventAnswer(const EventOutcome& o) {
  using Kind = EventOutcome::Kind;
  switch (o.kind) {
    case Kind::kStored:
    case Kind::kReplayed: {
      Answer a{o.status, o.body, "application/json", {}};
      a.headers["Location"] = StatusPath(o.saga, o.run_key);
      return a;
    }
    case Kind::kInvalidRunKey:
      return InvalidPathKeyAnswer();
    case Kind::kNoRun:
      return ProblemAnswer(404, "not_found", "no saga with this Idempotency-Key");
    case Kind::kOtherSaga:
      return ProblemAnswer(404, "not_found", "no run of this saga with this Idempotency-Key");
    case Kind::kNotExpected:
      return ProblemAnswer(409, "event_not_expected", o.detail);
    case Kind::kInvalid:
      return ProblemAnswer(400, "invalid_request", o.detail);
    case Kind::kReused:
      return ProblemAnswer(422, "idempotency_key_reused",
                           "this Idempotency-Key delivered this event with another payload");
    case Kind::kAlreadyReceived:
      return ProblemAnswer(
          409, "event_already_received",
          "the run has this event already, delivered under another Idempotency-Key");
    case Kind::kNotAccepted:
      break;
  }
  return ProblemAnswer(409, "event_not_accepted", o.detail);
}

void AddEventRoutes(common::http::Server& server, const EventRoutes& d) {
  // Captures: saga, run key, event name (key and name as the server hands them, with %2F and
  // %25 still encoded).
  server.Post(R"(/v1/runs/([^/]+)/([^/]+)/events/([^/]+))", [d](const httplib::Request& req,
                                                                httplib::Response& res) {
    auto tenant = Tenant(d.auth, req);
    if (!tenant) return SetAnswer(res, UnauthorizedAnswer());
    auto target = d.events.Find({.tenant_id = *tenant,
                                 .saga = req.matches[1].str(),
                                 .run_key = common::http::DecodeCapture(req.matches[2].str()),
                                 .event = common::http::DecodeCapture(req.matches[3].str())});
    if (!target.Found()) return SetAnswer(res, EventAnswer(target.refused));
    auto key =
        common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                    req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
    if (!key.ok()) return common::http::SetError(res, 400, key.error, key.message);
    auto payload = common::http::ParseJsonBody(req, res, d.limits);
    if (!payload) return;
    SetAnswer(res, EventAnswer(d.events.Deliver(target, key.key, *payload)));
  });
}

}  // namespace idemsaga::orchestrator::http
