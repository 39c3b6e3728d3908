// POST /v1/runs/{saga}/{key}/events/{name}: an external event for one saga run (a payment
// provider's webhook, an approval), under its own Idempotency-Key. The AMQP intake's event
// messages come in as this route's requests, through the same Deliver.
#include <regex>
#include <stdexcept>
#include <string_view>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/percent_encode.hpp"
#include "common/strings.hpp"
#include "orchestrator/http/routes.hpp"

namespace orchestrator::http {
namespace {

using common::http::SetError;

// Whether the run still takes `event`: it runs its actions, and the step that awaits the
// event has not ended. "" when it does; otherwise why not.
std::string WhyNotAccepted(const SagaRow& row, const saga::StepDefinition& step) {
  if (row.status == SagaStatus::kCompensating) {
    return "the run is being compensated: it takes no more events";
  }
  if (row.status != SagaStatus::kStarted) {
    return std::string("the run has ended (") + ToString(row.status) + "): it takes no more events";
  }
  for (const auto& s : row.steps) {
    if (!s.is_object() || s.value("name", "") != step.name) continue;
    auto status = saga::ParseStepStatus(s.value("status", ""));
    if (status == saga::StepStatus::kSucceeded || status == saga::StepStatus::kFailed ||
        status == saga::StepStatus::kSkipped) {
      return "the step that awaits this event (" + step.name + ") has ended";
    }
  }
  return "";
}

// Answers the refusal: nothing was stored.
KeyOutcome Refuse(httplib::Response& res, int status, std::string_view code,
                  std::string_view detail) {
  SetError(res, status, code, detail);
  return KeyOutcome::kNone;
}

// The route's pattern: saga, run key, event name (key and name as the server hands them,
// with %2F and %25 still encoded).
constexpr const char* kEventRoute = R"(/v1/runs/([^/]+)/([^/]+)/events/([^/]+))";

// `req.matches` holds the route's captures. Returns what the event's key said (see routes.hpp).
KeyOutcome Deliver(const EventRoutes& d, const httplib::Request& req, httplib::Response& res) {
  auto row = PathSaga(req, res, d.auth, d.store, 2);
  if (!row) return KeyOutcome::kNone;
  if (row->saga_name != req.matches[1].str()) {
    return Refuse(res, 404, "not_found", "no run of this saga with this Idempotency-Key");
  }
  const std::string name = common::http::DecodeCapture(req.matches[3].str());
  const saga::Definition* definition = d.registry.Find(row->saga_name, row->saga_version);
  const saga::StepDefinition* step = definition ? definition->Awaiting(name) : nullptr;
  if (step == nullptr) {
    // A child's events included: they are addressed to this run.
    std::vector<std::string> awaited;
    if (definition != nullptr) awaited = definition->Events();
    return Refuse(res, 409, "event_not_expected",
                  awaited.empty()
                      ? "this run awaits no events"
                      : "this run awaits no such event; it awaits: " + common::Join(awaited, ", "));
  }
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) return Refuse(res, 400, key.error, key.message);
  auto payload = common::http::ParseJsonBody(req, res, d.limits);
  if (!payload) return KeyOutcome::kNone;
  if (step->wait->validate) {
    try {
      step->wait->validate(name, *payload);
    } catch (const std::exception& e) {  // InvalidInput, or a JSON read of the wrong type
      return Refuse(res, 400, "invalid_request", e.what());
    }
  }
  const std::string run_path = StatusPath(row->saga_name, row->key);
  const std::string route =
      "/v1/runs/" + row->saga_name + "/" + common::PercentEncode(row->key) + "/events/" + name;
  nlohmann::json answer = {{"status", "received"},
                           {"saga", row->saga_name},
                           {"idempotency_key", row->key},
                           {"event", name},
                           {"event_idempotency_key", key.key}};
  std::string why_not = WhyNotAccepted(*row, *step);
  auto delivered =
      d.events.Deliver({.tenant_id = row->tenant_id,
                        .run_key = row->key,
                        .name = name,
                        .event_key = key.key,
                        .request_hash = common::RequestFingerprint("POST", route, *payload),
                        .wait_events = step->wait->events,
                        .payload = *payload,
                        .response_status = 202,
                        .response_body = answer.dump()},
                       why_not.empty());
  switch (delivered.kind) {
    case Delivered::kStored:
      common::Log("event_received", {{"tenant", row->tenant_id},
                                     {"key", row->key},
                                     {"event", name},
                                     {"event_key", key.key},
                                     {"trace_id", row->trace_id}});
      [[fallthrough]];
    case Delivered::kReplayed:
      res.status = delivered.response_status;
      res.set_content(delivered.response_body, "application/json");
      res.set_header("Location", run_path);
      return delivered.kind == Delivered::kStored ? KeyOutcome::kClaimed : KeyOutcome::kReplayed;
    case Delivered::kKeyReused:
      SetError(res, 422, "idempotency_key_reused",
               "this Idempotency-Key delivered this event with another payload");
      return KeyOutcome::kMismatch;
    case Delivered::kAlreadyReceived:
      return Refuse(res, 409, "event_already_received",
                    "the run has this event already, delivered under another Idempotency-Key");
    case Delivered::kNotAccepted:
      return Refuse(
          res, 409, "event_not_accepted",
          why_not.empty()
              ? "the run has taken another event of this wait, or ended: it takes this one no "
                "more"
              : why_not);
  }
  throw std::logic_error("unhandled event delivery outcome");
}

}  // namespace

KeyOutcome DeliverEvent(const EventRoutes& d, const httplib::Request& req, httplib::Response& res) {
  // The captures point into the path they matched: matched on a copy this call owns.
  httplib::Request routed = req;
  static const std::regex route(kEventRoute);
  if (!std::regex_match(routed.path, routed.matches, route)) {
    return Refuse(res, 404, "not_found", "no such route");
  }
  return Deliver(d, routed, res);
}

void AddEventRoutes(common::http::Server& server, const EventRoutes& d) {
  server.Post(kEventRoute,
              [d](const httplib::Request& req, httplib::Response& res) { Deliver(d, req, res); });
}

}  // namespace orchestrator::http
