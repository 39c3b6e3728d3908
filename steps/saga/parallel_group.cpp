// Runner::RunGroup: the branches of a parallel group, each on a thread of its own, under one
// journal that only the group writes to.
#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "common/log.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {
namespace {

using Clock = std::chrono::steady_clock;

// What the branches of one run of a group share. Guarded by `mu`.
struct GroupState {
  std::mutex mu;
  bool stop = false;      // a branch failed for good: the others send no further attempt
  bool fenced = false;    // the saga's lease is lost
  int finished = 0;       // branches ended so far, earlier runs of the group included
  size_t ended_here = 0;  // branches of this run that ended
  // The latest wake-up a parked branch asked for: the group resumes when every waiting
  // branch is due (none is sent before its own Retry-After).
  std::optional<Clock::time_point> wake;
};

// A branch's view of the saga's journal: the lease is the saga's; what a branch would write
// (a park, a deferral) is only noted, and the group writes it, with every branch's record,
// once all have ended. A branch stops at its next lease check once the group has failed.
class BranchJournal : public Journal {
 public:
  BranchJournal(Journal& journal, GroupState& state) : journal_(journal), state_(state) {}

  bool KeepLease() override {
    std::lock_guard lock(state_.mu);
    if (state_.stop || state_.fenced) return false;
    if (!journal_.KeepLease()) state_.fenced = true;
    return !state_.fenced;
  }
  std::chrono::milliseconds KeepLeaseEvery() const override { return journal_.KeepLeaseEvery(); }
  bool BeginCompensation(const std::vector<StepRecord>&, const StepResult&,
                         const std::string&) override {
    throw std::logic_error("a parallel branch does not compensate");
  }
  bool DeferStuck(const std::vector<StepRecord>&, std::chrono::milliseconds) override {
    std::lock_guard lock(state_.mu);
    state_.stop = true;  // the saga stops here, visibly: the siblings send nothing more
    return true;         // Act reports kDeferred; the group defers the saga
  }
  ParkResult Park(const std::vector<StepRecord>&, std::chrono::milliseconds wake_in) override {
    std::lock_guard lock(state_.mu);
    auto wake = Clock::now() + wake_in;
    if (!state_.wake || wake > *state_.wake) state_.wake = wake;
    return ParkResult::kParked;
  }

 private:
  Journal& journal_;
  GroupState& state_;
};

struct BranchRun {
  size_t step = 0;  // index into the definition's steps and the result's records
  StepRecord record;
  StepResult answer = StepResult::Retryable("not run");
  std::optional<SagaEnd> interrupted;
  std::exception_ptr error;  // a journal that threw (its database is down): rethrown
};

bool Ended(const BranchRun& run) { return !run.interrupted && !run.error; }

}  // namespace

std::optional<SagaEnd> Runner::RunGroup(size_t first, size_t last, const SagaInput& input,
                                        SagaResult& result, Journal& journal,
                                        const common::trace::SpanContext& saga_span) const {
  const auto& defs = definition_.steps();
  for (;;) {
    GroupState state;
    std::vector<BranchRun> runs;
    for (size_t i = first; i < last; ++i) {
      state.finished = std::max(state.finished, result.steps[i].finish_order);
      const auto status = result.steps[i].status;
      if (status == StepStatus::kSucceeded || status == StepStatus::kSkipped) continue;
      runs.push_back({.step = i, .record = result.steps[i]});
    }
    if (runs.empty()) return std::nullopt;

    auto run_branch = [&](BranchRun& run) noexcept {
      try {
        BranchJournal branch_journal(journal, state);
        std::vector<StepRecord> own;  // a branch's park or deferral is the group's to write
        run.answer = Act(defs[run.step], input, result.outputs, run.record, own, branch_journal,
                         run.interrupted, saga_span);
        std::lock_guard lock(state.mu);
        if (!Ended(run)) return;
        run.record.finish_order = ++state.finished;
        if (run.answer.outcome != Outcome::kSucceeded) state.stop = true;
        // One branch has ended and a sibling may still be running.
        if (run.answer.outcome == Outcome::kSucceeded && ++state.ended_here < runs.size()) {
          Boundary("between_parallel_branches");
        }
      } catch (...) {
        run.error = std::current_exception();
        std::lock_guard lock(state.mu);
        state.stop = true;  // the journal failed (its database is down): the saga stops
      }
    };
    {
      std::vector<std::jthread> others;
      others.reserve(runs.size());
      for (size_t k = 1; k < runs.size(); ++k) {
        try {
          others.emplace_back(run_branch, std::ref(runs[k]));
        } catch (...) {  // no thread to be had: this branch is not sent, and nor are the rest
          std::lock_guard lock(state.mu);
          state.stop = true;
          for (size_t j = k; j < runs.size(); ++j) runs[j].error = std::current_exception();
          break;
        }
      }
      run_branch(runs[0]);
    }  // joined

    for (const auto& run : runs) {
      if (run.error) std::rethrow_exception(run.error);
    }
    if (state.fenced) return SagaEnd::kFenced;  // write nothing
    std::sort(runs.begin(), runs.end(), [](const BranchRun& a, const BranchRun& b) {
      if (Ended(a) != Ended(b)) return Ended(a);
      return a.record.finish_order < b.record.finish_order;
    });
    bool failed = false;
    bool deferred = false;
    bool abandoned = false;
    for (auto& run : runs) {
      auto& record = result.steps[run.step];
      record = std::move(run.record);
      if (!Ended(run)) {
        deferred = deferred || run.interrupted == SagaEnd::kDeferred;
        abandoned = abandoned || run.interrupted == SagaEnd::kAbandoned;
        continue;
      }
      record.replayed = run.answer.replayed;
      if (run.answer.outcome == Outcome::kSucceeded) {
        record.status = StepStatus::kSucceeded;
        record.action_confirmed = true;
        record.output = run.answer.output;
        result.outputs[record.name] = run.answer.output;
        continue;
      }
      record.status =
          run.answer.outcome == Outcome::kTerminal ? StepStatus::kFailed : StepStatus::kInDoubt;
      record.detail = run.answer.detail;
      if (!failed) {
        result.failure = run.answer;
        result.failed_step = record.name;
      }
      failed = true;
    }
    if (failed) {
      // A branch stopped before it ended may have been applied by an attempt it sent.
      for (const auto& run : runs) {
        auto& record = result.steps[run.step];
        if (!Ended(run) && record.attempts > 0) {
          record.status = StepStatus::kInDoubt;
          record.finish_order = ++state.finished;
        }
      }
      return std::nullopt;
    }
    if (deferred) {
      // Act has logged why; the saga waits, visibly, with every branch's record.
      return journal.DeferStuck(result.steps, policy_.stuck_retry_interval) ? SagaEnd::kDeferred
                                                                            : SagaEnd::kFenced;
    }
    if (abandoned) return SagaEnd::kAbandoned;
    if (std::all_of(runs.begin(), runs.end(), Ended)) return std::nullopt;  // all succeeded
    // The others wait; a stop that is none of the above decides nothing, and the next owner
    // goes on from the records.
    if (!state.wake) return SagaEnd::kAbandoned;
    // The group waits until its latest waiting branch is due.
    auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(*state.wake - Clock::now()));
    if (auto stop = Pause(left, input, result.steps, journal)) return stop;
    if (should_stop_()) return SagaEnd::kAbandoned;
  }
}

}  // namespace idemsaga::steps::saga
