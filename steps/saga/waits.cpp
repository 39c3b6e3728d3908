// The steps that wait instead of calling: a timer, and a wait for an external event (parked
// when the journal can, polled when it cannot) (runner.hpp).
#include <algorithm>

#include "common/log.hpp"
#include "common/strings.hpp"
#include "steps/saga/run_clock.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {

using detail::FromUnixMs;
using detail::ToUnixMs;

StepResult Runner::Timer(const StepDefinition& step, const SagaInput& input,
                         const nlohmann::json& outputs, StepRecord& record,
                         std::vector<StepRecord>& all, Journal& journal,
                         std::optional<SagaEnd>& interrupted) const {
  // The timer counts from the first arrival, which the checkpoint of a park keeps.
  if (record.first_attempt_unix_ms == 0) record.first_attempt_unix_ms = NowUnixMs();
  StepContext ctx = Context(step, input, outputs, record.action_key);
  ctx.arrived_at = FromUnixMs(record.first_attempt_unix_ms);
  std::chrono::system_clock::time_point wake;
  try {
    wake = std::min(step.wake_at(ctx), ctx.arrived_at + step.longest_wait);
  } catch (const std::exception& e) {
    std::string why = std::string("the wake-up time did not compute: ") + e.what();
    interrupted = Defer(input, step.name, why, all, journal);
    return StepResult::Blocked(0, why);
  }
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - SystemNow());
    if (left.count() <= 0) {
      record.detail.clear();
      return StepResult::Succeeded({{"woke_at_unix_ms", ToUnixMs(wake)}});
    }
    // A wait has applied nothing: a cancel ends it here, as at a step boundary.
    if (journal.CancelRequested()) return CancelledByOperator();
    record.status = StepStatus::kWaiting;
    record.detail = "sleeping until unix ms " + std::to_string(ToUnixMs(wake));
    if (auto stop = Pause(left, input, all, journal)) {
      interrupted = stop;
      return StepResult::Retryable("waiting");
    }
    if (should_stop_()) {
      interrupted = SagaEnd::kAbandoned;
      return StepResult::Retryable("waiting");
    }
  }
}

StepResult Runner::AwaitEvent(const StepDefinition& step, const SagaInput& input,
                              const nlohmann::json& outputs, StepRecord& record,
                              std::vector<StepRecord>& all, Journal& journal,
                              std::optional<SagaEnd>& interrupted,
                              std::vector<std::string>& waiting_for) const {
  const EventWait& wait = *step.wait;
  if (record.first_attempt_unix_ms == 0) record.first_attempt_unix_ms = NowUnixMs();
  StepContext ctx = Context(step, input, outputs, record.action_key);
  ctx.arrived_at = FromUnixMs(record.first_attempt_unix_ms);
  const auto deadline = ctx.arrived_at + wait.timeout;
  const std::string names = common::Join(wait.events, " or ");
  for (;;) {
    if (!journal.KeepLease()) {
      interrupted = SagaEnd::kFenced;
      return StepResult::Retryable("fenced");
    }
    // An event that came is taken even when the timeout has passed since: it was in time
    // if it was stored before the wake-up that would have timed the wait out.
    if (auto event = journal.Event(wait.events)) {
      StepResult r = StepResult::Succeeded({{"event", event->name}, {"payload", event->payload}});
      if (wait.decide) {
        try {
          r = wait.decide(event->name, event->payload, ctx);
        } catch (const std::exception& e) {
          r = StepResult::Blocked(0, std::string("deciding on the event threw: ") + e.what());
        }
      }
      if (r.outcome == Outcome::kSucceeded || r.outcome == Outcome::kTerminal) {
        record.detail.clear();
        return r;
      }
      std::string why = "event " + event->name + ": " +
                        (r.detail.empty() ? "decide must answer succeeded or terminal" : r.detail);
      interrupted = Defer(input, step.name, why, all, journal);
      return StepResult::Blocked(0, why);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SystemNow());
    if (left.count() <= 0) {
      if (wait.on_timeout) return *wait.on_timeout;
      return StepResult::Terminal(409, "event_timeout",
                                  "no " + names + " event arrived within " +
                                      std::to_string(wait.timeout.count()) +
                                      " ms; the steps before were compensated");
    }
    if (should_stop_()) {
      interrupted = SagaEnd::kAbandoned;
      return StepResult::Retryable("waiting");
    }
    if (journal.CancelRequested()) return CancelledByOperator();  // as in Timer
    record.status = StepStatus::kWaiting;
    record.detail = "waiting for " + names;
    // park_after 0 means never park: the wait then polls on this thread.
    auto parked = policy_.park_after.count() > 0 ? journal.AwaitEvent(all, wait.events, left)
                                                 : Journal::AwaitResult::kUnsupported;
    switch (parked) {
      case Journal::AwaitResult::kParked:
        waiting_for = wait.events;
        interrupted = SagaEnd::kParked;
        return StepResult::Retryable("waiting");
      case Journal::AwaitResult::kFenced:
        interrupted = SagaEnd::kFenced;
        return StepResult::Retryable("fenced");
      case Journal::AwaitResult::kArrived:
        break;
      case Journal::AwaitResult::kUnsupported:
        sleep_(std::min(left, kEventPollEvery));
        break;
    }
  }
}

}  // namespace idemsaga::steps::saga
