#include "orchestrator/receive_event.hpp"

#include <stdexcept>

#include "common/crypto.hpp"
#include "common/log.hpp"
#include "common/percent_encode.hpp"
#include "common/strings.hpp"
#include "orchestrator/start_run.hpp"

namespace idemsaga::orchestrator {
namespace {

EventOutcome Refused(EventOutcome::Kind kind, std::string detail = "") {
  EventOutcome o;
  o.kind = kind;
  o.detail = std::move(detail);
  return o;
}

// Whether the run still takes `event`: it runs its actions, and the step that awaits the
// event has not ended. "" when it does; otherwise why not.
std::string WhyNotAccepted(const store::SagaRow& row, const steps::saga::StepDefinition& step) {
  if (row.status == store::SagaStatus::kCompensating) {
    return "the run is being compensated: it takes no more events";
  }
  if (row.status != store::SagaStatus::kStarted) {
    return std::string("the run has ended (") + ToString(row.status) + "): it takes no more events";
  }
  for (const auto& s : row.steps) {
    if (s.name != step.name) continue;
    if (s.status == steps::saga::StepStatus::kSucceeded ||
        s.status == steps::saga::StepStatus::kFailed ||
        s.status == steps::saga::StepStatus::kSkipped) {
      return "the step that awaits this event (" + step.name + ") has ended";
    }
  }
  return "";
}

}  // namespace

KeyOutcome EventOutcome::Key() const {
  switch (kind) {
    case Kind::kStored:
      return KeyOutcome::kClaimed;
    case Kind::kReplayed:
      return KeyOutcome::kReplayed;
    case Kind::kReused:
      return KeyOutcome::kMismatch;
    default:
      return KeyOutcome::kNone;
  }
}

EventReceiver::Target EventReceiver::Find(const EventRequest& r) const {
  Target t;
  if (!common::IsValidKeyBytes(r.run_key, kMaxParentKeyLength)) {
    t.refused = Refused(EventOutcome::Kind::kInvalidRunKey);
    return t;
  }
  t.run = store_.Get(r.tenant_id, r.run_key);
  if (!t.run) {
    t.refused = Refused(EventOutcome::Kind::kNoRun);
    return t;
  }
  if (t.run->saga_name != r.saga) {
    t.refused = Refused(EventOutcome::Kind::kOtherSaga);
    return t;
  }
  t.event = r.event;
  const steps::saga::Definition* definition = registry_.Find(t.run->saga_name, t.run->saga_version);
  t.step = definition ? definition->Awaiting(r.event) : nullptr;
  if (t.step == nullptr) {
    // A child's events included: they are addressed to this run.
    std::vector<std::string> awaited;
    if (definition != nullptr) awaited = definition->Events();
    t.refused = Refused(EventOutcome::Kind::kNotExpected,
                        awaited.empty() ? "this run awaits no events"
                                        : "this run awaits no such event; it awaits: " +
                                              common::Join(awaited, ", "));
  }
  return t;
}

EventOutcome EventReceiver::Deliver(const Target& t, const std::string& event_key,
                                    const nlohmann::json& payload) const {
  if (!t.Found()) return t.refused;
  const store::SagaRow& row = *t.run;
  const std::string& name = t.event;
  if (t.step->wait->validate) {
    try {
      t.step->wait->validate(name, payload);
    } catch (const std::exception& e) {  // InvalidInput, or a JSON read of the wrong type
      return Refused(EventOutcome::Kind::kInvalid, e.what());
    }
  }
  // The path the delivery's fingerprint is scoped by, as the HTTP route has always named it:
  // a fingerprint is stored with every key, so it must not change with the adapter.
  const std::string route =
      "/v1/runs/" + row.saga_name + "/" + common::PercentEncode(row.key) + "/events/" + name;
  nlohmann::json answer = {{"status", "received"},
                           {"saga", row.saga_name},
                           {"idempotency_key", row.key},
                           {"event", name},
                           {"event_idempotency_key", event_key}};
  std::string why_not = WhyNotAccepted(row, *t.step);
  auto delivered =
      events_.Deliver({.tenant_id = row.tenant_id,
                       .run_key = row.key,
                       .name = name,
                       .event_key = event_key,
                       .request_hash = common::RequestFingerprint("POST", route, payload),
                       .wait_events = t.step->wait->events,
                       .payload = payload,
                       .response_status = 202,
                       .response_body = answer.dump()},
                      why_not.empty());
  switch (delivered.kind) {
    case store::Delivered::kStored:
      common::Log("event_received", {{"tenant", row.tenant_id},
                                     {"key", row.key},
                                     {"event", name},
                                     {"event_key", event_key},
                                     {"trace_id", row.trace_id}});
      [[fallthrough]];
    case store::Delivered::kReplayed: {
      EventOutcome o;
      o.kind = delivered.kind == store::Delivered::kStored ? EventOutcome::Kind::kStored
                                                           : EventOutcome::Kind::kReplayed;
      o.status = delivered.response_status;
      o.body = delivered.response_body;
      o.saga = row.saga_name;
      o.run_key = row.key;
      return o;
    }
    case store::Delivered::kKeyReused:
      return Refused(EventOutcome::Kind::kReused);
    case store::Delivered::kAlreadyReceived:
      return Refused(EventOutcome::Kind::kAlreadyReceived);
    case store::Delivered::kNotAccepted:
      return Refused(EventOutcome::Kind::kNotAccepted,
                     why_not.empty() ? "the run has taken another event of this wait, or ended: "
                                       "it takes this one no more"
                                     : why_not);
  }
  throw std::logic_error("unhandled event delivery outcome");
}

}  // namespace idemsaga::orchestrator
