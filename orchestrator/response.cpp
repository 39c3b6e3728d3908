#include "orchestrator/response.hpp"

#include "common/http/problem.hpp"
#include "orchestrator/store/saga_status.hpp"

namespace idemsaga::orchestrator {

common::http::Answer BuildResponse(const steps::saga::SagaResult& result,
                                   const ResponseContext& ctx) {
  if (result.end == steps::saga::SagaEnd::kCompleted && result.answer) {
    return {result.answer->status,
            result.answer->body.dump(),
            "application/json",
            {{"Location", ctx.location}}};
  }
  if (result.end == steps::saga::SagaEnd::kCompleted) {
    nlohmann::json body = nlohmann::json::object();
    for (const auto& [step, output] : result.outputs.items()) {
      if (!output.is_object()) continue;
      for (const auto& [field, value] : output.items()) {
        if (field.size() > 3 && field.compare(field.size() - 3, 3, "_id") == 0) body[field] = value;
      }
    }
    // Set last: a participant's own "order_id" (any saga's step may answer one) never
    // replaces the orchestrator's in the answer replayed for ever.
    body["status"] = ToString(store::SagaStatus::kCompleted);
    body["order_id"] = ctx.order_id;
    body["idempotency_key"] = ctx.idempotency_key;
    body["trace_id"] = ctx.trace_id;
    return {201, body.dump(), "application/json", {{"Location", ctx.location}}};
  }
  const steps::saga::StepResult& f = result.failure;
  bool business =
      f.outcome == steps::saga::Outcome::kTerminal && f.http_status >= 400 && f.http_status < 500;
  // 502, not 503: a 503 tells a client to retry, and a retry of this key only replays this.
  int status = business ? f.http_status : 502;
  std::string code =
      business && !f.error_code.empty() ? f.error_code : result.failed_step + "_unavailable";
  std::string message = business ? f.detail
                                 : "the " + result.failed_step +
                                       " step did not answer in time; completed steps were "
                                       "compensated; send a new Idempotency-Key to try again";
  // A problem (RFC 9457): its `status` is the HTTP status; the saga's is `saga_status`.
  std::string body =
      common::http::ProblemBody(status, code, message,
                                {{"saga_status", ToString(store::SagaStatus::kFailed)},
                                 {"step", result.failed_step},
                                 {"compensated", result.compensated},
                                 {"retryable", false},
                                 {"order_id", ctx.order_id},
                                 {"idempotency_key", ctx.idempotency_key},
                                 {"trace_id", ctx.trace_id}});
  return {status, body, common::http::kProblemContentType, {}};
}

}  // namespace idemsaga::orchestrator
