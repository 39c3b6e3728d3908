// The RunOutcomes the saga service gives (saga_service.hpp), built in one place each: what a
// request is told when its key is in use, reused, replayed, still running or when the service
// cannot answer now. Internal to orchestrator/ (saga_service*.cpp). Pure functions.
#pragma once

#include <exception>
#include <string>

#include "orchestrator/saga_service.hpp"

namespace idemsaga::orchestrator::outcomes {

// Shutting down, an outage, or a row this build cannot run: a retry with the same key is safe.
RunOutcome Unavailable(std::string detail);
// Stopped by an internal error: nothing final was stored.
RunOutcome Internal(std::string detail);
// Another request runs the saga of `row`: ask again about when its lease runs out (1-5 s).
RunOutcome InProgress(const store::SagaRow& row);
// The key came with another request.
RunOutcome Reused();
// The stored answer `f` of a finished run, as a replay.
RunOutcome Replay(const store::FinishedAnswer& f);
// Still running past the response budget (queued, or started and not ended yet).
RunOutcome Running(const store::SagaRow& row, KeyOutcome outcome);
// What a request whose saga threw past Drive gets: unavailable for an outage, else internal.
RunOutcome Unanswered(const std::exception_ptr& e);

}  // namespace idemsaga::orchestrator::outcomes
