#include "orchestrator/run_outcomes.hpp"

#include <algorithm>
#include <cmath>

#include "common/log.hpp"
#include "common/pg/errors.hpp"

namespace idemsaga::orchestrator::outcomes {

RunOutcome Unavailable(std::string detail) {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kUnavailable;
  o.detail = std::move(detail);
  return o;
}

RunOutcome Internal(std::string detail) {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kInternal;
  o.detail = std::move(detail);
  return o;
}

RunOutcome InProgress(const store::SagaRow& row) {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kInProgress;
  o.outcome = KeyOutcome::kInProgress;
  o.retry_after = std::chrono::seconds(
      std::max(1, static_cast<int>(std::ceil(std::min(row.lease_seconds_left, 5.0)))));
  return o;
}

RunOutcome Reused() {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kReused;
  o.outcome = KeyOutcome::kMismatch;
  return o;
}

RunOutcome Replay(const store::FinishedAnswer& f) {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kReplayed;
  o.answer = common::http::StoredAnswer(f.status, f.body, f.headers);
  // Part of what every adapter hands on: a retry can tell a replay from a first answer.
  o.answer.headers["Idempotent-Replayed"] = "true";
  o.outcome = KeyOutcome::kReplayed;
  o.trace_id = f.trace_id;
  o.root_span_id = f.root_span_id;
  return o;
}

RunOutcome Running(const store::SagaRow& row, KeyOutcome outcome) {
  RunOutcome o;
  o.kind = RunOutcome::Kind::kRunning;
  o.order_id = row.order_id;
  o.outcome = outcome;
  o.trace_id = row.trace_id;
  o.root_span_id = row.root_span_id;
  return o;
}

RunOutcome Unanswered(const std::exception_ptr& e) {
  auto failure = common::pg::Classify(e);
  common::Log("saga_answer_failed", {{"error", failure.what}});
  if (failure.kind == common::pg::Failure::kUnavailable) {
    return Unavailable("the database is unavailable; retrying with the same key is safe");
  }
  return Internal("internal error");
}

}  // namespace idemsaga::orchestrator::outcomes
