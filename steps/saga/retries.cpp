// Retries: a step's policy with its overrides, the longest a run may take, and the waits between
// attempts (full-jitter backoff, slept keeping the lease or parked) (runner.hpp).
#include <algorithm>
#include <random>

#include "steps/saga/run_clock.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {

using detail::Clock;

RetryPolicy RetryPolicy::For(const StepPolicy& step) const {
  RetryPolicy p = *this;
  p.max_attempts = step.max_attempts.value_or(p.max_attempts);
  p.initial_backoff = step.initial_backoff.value_or(p.initial_backoff);
  p.max_backoff = step.max_backoff.value_or(p.max_backoff);
  p.step_deadline = step.step_deadline.value_or(p.step_deadline);
  p.compensation_stuck_after = step.compensation_stuck_after.value_or(p.compensation_stuck_after);
  return p;
}

std::chrono::milliseconds LongestRun(const RetryPolicy& policy, const Definition& definition) {
  std::chrono::milliseconds total{0};
  std::chrono::milliseconds group_longest{0};  // a parallel group lasts as its longest branch
  const auto& steps = definition.steps();
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& step = steps[i];
    auto longest = step.kind == StepKind::kCall    ? policy.For(step.policy).step_deadline
                   : step.kind == StepKind::kChild ? LongestRun(policy, *step.child)
                                                   : step.longest_wait;
    if (step.group < 0) {
      total += longest;
      continue;
    }
    group_longest = std::max(group_longest, longest);
    if (i + 1 == steps.size() || steps[i + 1].group != step.group) {
      total += group_longest;
      group_longest = std::chrono::milliseconds(0);
    }
  }
  return total;
}

std::optional<SagaEnd> Runner::Backoff(const RetryPolicy& policy, int attempt,
                                       std::chrono::milliseconds at_least, const SagaInput& input,
                                       const std::vector<StepRecord>& all, Journal& journal,
                                       bool busy) const {
  // Full jitter (AWS architecture blog): spreads retries of many sagas hitting one outage.
  auto cap = std::min<long long>(policy.max_backoff.count(), policy.initial_backoff.count()
                                                                 << std::min(attempt, 20));
  thread_local std::mt19937_64 rng{std::random_device{}()};
  auto jitter = std::chrono::milliseconds(std::uniform_int_distribution<long long>(0, cap)(rng));
  return Pause(std::max(jitter, at_least), input, all, journal, busy);
}

std::optional<SagaEnd> Runner::Pause(std::chrono::milliseconds left, const SagaInput& input,
                                     const std::vector<StepRecord>& all, Journal& journal,
                                     bool busy) const {
  // A short wait that still ends inside the response budget is slept, so that a blip ends in
  // 201, unless the participant is saturated (busy): then sleeping would hold a thread for it.
  bool answered_in_time = Clock::now() + left < input.answer_by && !busy;
  if (policy_.park_after.count() > 0 && (left >= policy_.park_after || busy) && !answered_in_time) {
    // A long wait holds no thread: checkpoint and let recovery wake the saga.
    switch (journal.Park(all, left)) {
      case Journal::ParkResult::kParked:
        return SagaEnd::kParked;
      case Journal::ParkResult::kFenced:
        return SagaEnd::kFenced;
      case Journal::ParkResult::kUnsupported:
        break;
    }
  }
  // A wait is slept in slices that keep the lease: another replica must not take over a saga
  // that is only waiting.
  const auto every =
      std::max(std::chrono::milliseconds(1), std::min(kLeaseCheckEvery, journal.KeepLeaseEvery()));
  do {
    auto slice = std::min(left, every);
    sleep_(slice);
    left -= slice;
    if (left.count() > 0 && !journal.KeepLease()) return SagaEnd::kFenced;
  } while (left.count() > 0 && !should_stop_());
  return std::nullopt;
}

}  // namespace idemsaga::steps::saga
