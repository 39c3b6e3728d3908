// POST /v1/runs/{saga}/{key}/events/{name}: an external event for one saga run (a payment
// provider's webhook, an approval), under its own Idempotency-Key.
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

void Deliver(const EventRoutes& d, const httplib::Request& req, httplib::Response& res) {
  auto row = PathSaga(req, res, d.auth, d.store, 2);
  if (!row) return;
  if (row->saga_name != req.matches[1].str()) {
    return SetError(res, 404, "not_found", "no run of this saga with this Idempotency-Key");
  }
  const std::string name = common::http::DecodeCapture(req.matches[3].str());
  const saga::Definition* definition = d.registry.Find(row->saga_name, row->saga_version);
  const saga::StepDefinition* step = definition ? definition->Awaiting(name) : nullptr;
  if (step == nullptr) {
    std::vector<std::string> awaited;
    if (definition != nullptr) {
      for (const auto& s : definition->steps()) {
        if (s.kind == saga::StepKind::kEvent) {
          awaited.insert(awaited.end(), s.wait->events.begin(), s.wait->events.end());
        }
      }
    }
    return SetError(res, 409, "event_not_expected",
                    awaited.empty() ? "this run awaits no events"
                                    : "this run awaits no such event; it awaits: " +
                                          common::Join(awaited, ", "));
  }
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) return SetError(res, 400, key.error, key.message);
  auto payload = common::http::ParseJsonBody(req, res, d.limits);
  if (!payload) return;
  if (step->wait->validate) {
    try {
      step->wait->validate(name, *payload);
    } catch (const std::exception& e) {  // InvalidInput, or a JSON read of the wrong type
      return SetError(res, 400, "invalid_request", e.what());
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
      return;
    case Delivered::kKeyReused:
      return SetError(res, 422, "idempotency_key_reused",
                      "this Idempotency-Key delivered this event with another payload");
    case Delivered::kAlreadyReceived:
      return SetError(res, 409, "event_already_received",
                      "the run has this event already, delivered under another Idempotency-Key");
    case Delivered::kNotAccepted:
      return SetError(res, 409, "event_not_accepted",
                      why_not.empty() ? "the run has taken another event of this wait, or ended: "
                                        "it takes this one no more"
                                      : why_not);
  }
}

}  // namespace

void AddEventRoutes(common::http::Server& server, const EventRoutes& d) {
  server.Post(R"(/v1/runs/([^/]+)/([^/]+)/events/([^/]+))",
              [d](const httplib::Request& req, httplib::Response& res) { Deliver(d, req, res); });
}

}  // namespace orchestrator::http
