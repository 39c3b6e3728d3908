// The answer a finished saga stores under its parent key and replays to every retry.
//
// Generic over definitions, so a saga declared in code needs no response code of its own:
//   completed -> 201 {"status":"completed","order_id","idempotency_key",<each step output's
//                     *_id fields>,"trace_id"}, or the answer the definition declares
//                     (Definition::Answer), as it is
//   failed    -> the failing step's 4xx (402 card_declined, 409 insufficient_stock, ...), or
//                502 <step>_unavailable when retries ran out, as a problem (RFC 9457,
//                application/problem+json): {"type","title","status":402,"detail","code",
//                "saga_status":"failed","step","compensated":[...],"retryable":false,
//                "order_id","idempotency_key","trace_id"}. Answers stored before 0.2 were
//                {"status":"failed","error":{"code","message","step"},...} and replay as such.
// Its headers are stored and replayed with it: Content-Type, and for a 201 the run's Location
// (/v1/orders/{key} or /v1/runs/{saga}/{key}).
// A stored answer is final: `retryable: false` says a retry with the same key gets these same
// bytes, and trying again needs a new key. 503 is kept for answers that store nothing.
// Pure function.
#pragma once

#include <map>
#include <string>

#include "common/http/problem.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator {

struct ResponseContext {
  std::string order_id;
  std::string idempotency_key;
  std::string trace_id;
  std::string location;  // where the run is read (StatusPath)
};

common::http::Answer BuildResponse(const steps::saga::SagaResult& result,
                                   const ResponseContext& ctx);

}  // namespace idemsaga::orchestrator
