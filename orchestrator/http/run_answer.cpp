// A RunOutcome (the "start a run" use case's answer) as HTTP: the one place where its
// in-progress, reused, invalid, unknown-saga, unavailable and still-running answers get their
// status, problem body and headers. A finished run's stored answer goes out as stored.
#include "orchestrator/http/answers.hpp"
#include "orchestrator/start_run.hpp"
#include "steps/protocol/participant_protocol.hpp"

namespace idemsaga::orchestrator::http {

using common::http::ProblemAnswer;

Answer InProgressAnswer(std::chrono::seconds retry_after) {
  // The guard's wording and code for the same situation: one 409 for either side of a step.
  using steps::protocol::Describe;
  const auto& in_progress = Describe(steps::protocol::Refusal::kKeyLockTimeout);
  return ProblemAnswer(Describe(in_progress.code).status, Describe(in_progress.code).name,
                       in_progress.detail, std::max(std::chrono::seconds(1), retry_after));
}

Answer UnauthorizedRunAnswer() {
  Answer a =
      ProblemAnswer(401, "unauthorized", "a valid API key is required (Authorization: Bearer)");
  a.headers["WWW-Authenticate"] = "Bearer";
  return a;
}

Answer UnauthorizedAnswer() {
  return ProblemAnswer(401, "unauthorized", "a valid API key is required");
}

Answer InvalidPathKeyAnswer() {
  return ProblemAnswer(400, "idempotency_key_invalid",
                       "the key in the path must be 1-" + std::to_string(kMaxParentKeyLength) +
                           " printable ASCII characters (percent-encoded in the URL)");
}

Answer RunAnswer(const RunOutcome& o, const std::string& saga, const std::string& key) {
  using Kind = RunOutcome::Kind;
  Answer a;
  switch (o.kind) {
    case Kind::kFinished:
    case Kind::kReplayed:
      a = o.answer;
      break;
    case Kind::kRunning: {
      nlohmann::json body = {{"status", ToString(o.status)},
                             {"order_id", o.order_id},
                             {"idempotency_key", key},
                             {"trace_id", o.trace_id}};
      if (o.waiting) body["waiting"] = true;
      if (o.stuck) body["stuck"] = true;
      if (!o.waiting_for.is_null()) body["waiting_for"] = o.waiting_for;
      a.status = 202;
      a.body = body.dump();
      a.headers["Location"] = StatusPath(saga, key);
      break;
    }
    case Kind::kInProgress:
      a = InProgressAnswer(o.retry_after);
      break;
    case Kind::kReused:
      a = ProblemAnswer(422, "idempotency_key_reused",
                        "this Idempotency-Key was used with a different request body");
      break;
    case Kind::kInvalid:
      a = ProblemAnswer(400, "invalid_request", o.detail);
      break;
    case Kind::kUnknownSaga:
      a = ProblemAnswer(404, "saga_not_found",
                        "no saga of this name is served here (GET /v1/runs lists them)");
      break;
    case Kind::kUnavailable:
      // An outage: the client is told when to retry (with the same key, which is safe).
      a = ProblemAnswer(503, "unavailable", o.detail);
      break;
    case Kind::kInternal:
      a = ProblemAnswer(500, "internal_error", o.detail);
      break;
  }
  if (!o.traceparent.empty()) a.headers["traceparent"] = o.traceparent;
  return a;
}

}  // namespace idemsaga::orchestrator::http
