// What the use cases' outcomes are as HTTP, built as data (common::http::Answer: status, body,
// headers) with no wire in it, so that every adapter that owes its caller HTTP's answer (the
// routes, with common::http::SetAnswer; the AMQP intake, in its replies and dead letters)
// builds it here, once: the problem bodies, their wording, Retry-After, Location.
//
// Pure functions; thread-safe.
//   common::http::SetAnswer(res, RunAnswer(outcome, "trip", key));
#pragma once

#include <chrono>
#include <string>

#include "common/http/problem.hpp"
#include "orchestrator/receive_event.hpp"
#include "orchestrator/saga_service.hpp"

namespace idemsaga::orchestrator::http {

using common::http::Answer;

// A RunOutcome for a run of `saga` under `key` (run_answer.cpp): the stored answer as stored,
// 202 + Location while it runs, or the problem for the rest; with the request's traceparent.
Answer RunAnswer(const RunOutcome& outcome, const std::string& saga, const std::string& key);
// An EventOutcome (event_routes.cpp): the stored 202 + Location of the run, or the problem.
Answer EventAnswer(const EventOutcome& outcome);

// 401 to a run's request: no valid API key (with WWW-Authenticate: Bearer).
Answer UnauthorizedRunAnswer();
// 401 to the other requests.
Answer UnauthorizedAnswer();
// 400 idempotency_key_invalid: a run's key in the path (or an event message's `run`) is no key.
Answer InvalidPathKeyAnswer();
// The orchestrator's one 409 idempotency_key_in_progress, with its Retry-After.
Answer InProgressAnswer(std::chrono::seconds retry_after);

}  // namespace idemsaga::orchestrator::http
