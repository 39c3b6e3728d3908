// A RunOutcome (the "start a run" use case's answer) as HTTP: the one place where its
// in-progress, reused, invalid, unknown-saga, unavailable and still-running answers get their
// status, problem body and headers. A finished run's stored answer goes out as stored.
#include "orchestrator/http/routes.hpp"
#include "steps/protocol/participant_protocol.hpp"

namespace orchestrator::http {

using common::http::SetError;

void SetInProgress(httplib::Response& res, std::chrono::seconds retry_after) {
  // The guard's wording and code for the same situation: one 409 for either side of a step.
  using steps::guard::Describe;
  const auto& in_progress = Describe(steps::guard::Refusal::kKeyLockTimeout);
  SetError(res, Describe(in_progress.code).status, Describe(in_progress.code).name,
           in_progress.detail);
  res.set_header("Retry-After", std::to_string(std::max<long long>(1, retry_after.count())));
}

void SendRunOutcome(const RunOutcome& o, const std::string& saga, const std::string& key,
                    httplib::Response& res) {
  using Kind = RunOutcome::Kind;
  switch (o.kind) {
    case Kind::kFinished:
    case Kind::kReplayed: {
      res.status = o.answer.status;
      auto type = o.answer.headers.find("Content-Type");
      res.set_content(o.answer.body,
                      type == o.answer.headers.end() ? "application/json" : type->second.c_str());
      for (const auto& [k, v] : o.answer.headers) {
        if (k != "Content-Type") res.set_header(k.c_str(), v);
      }
      break;
    }
    case Kind::kRunning: {
      nlohmann::json body = {{"status", ToString(o.status)},
                             {"order_id", o.order_id},
                             {"idempotency_key", key},
                             {"trace_id", o.trace_id}};
      if (o.waiting) body["waiting"] = true;
      if (o.stuck) body["stuck"] = true;
      if (!o.waiting_for.is_null()) body["waiting_for"] = o.waiting_for;
      res.status = 202;
      res.set_content(body.dump(), "application/json");
      res.set_header("Location", StatusPath(saga, key));
      break;
    }
    case Kind::kInProgress:
      SetInProgress(res, o.retry_after);
      break;
    case Kind::kReused:
      SetError(res, 422, "idempotency_key_reused",
               "this Idempotency-Key was used with a different request body");
      break;
    case Kind::kInvalid:
      SetError(res, 400, "invalid_request", o.detail);
      break;
    case Kind::kUnknownSaga:
      SetError(res, 404, "saga_not_found",
               "no saga of this name is served here (GET /v1/runs lists them)");
      break;
    case Kind::kUnavailable:
      // An outage: the client is told when to retry (with the same key, which is safe).
      SetError(res, 503, "unavailable", o.detail);
      res.set_header("Retry-After", "1");
      break;
    case Kind::kInternal:
      SetError(res, 500, "internal_error", o.detail);
      break;
  }
  if (!o.traceparent.empty()) res.set_header("traceparent", o.traceparent);
}

}  // namespace orchestrator::http
