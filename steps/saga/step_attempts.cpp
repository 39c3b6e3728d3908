// One step's attempts against its participant: the action, retried with the same derived key
// until it answers for good or its deadline passes, and its compensation, retried until it is
// undone or the saga shows as stuck; each attempt a span, a count and (when it matters) a log
// line (runner.hpp).
#include <algorithm>

#include "common/log.hpp"
#include "common/trace/trace_context.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {
namespace {

void LogStep(const char* event, const StepContext& ctx, const StepResult& r) {
  common::Log(event, {{"tenant", ctx.tenant_id},
                      {"key", ctx.parent_key},
                      {"step", ctx.step_name},
                      {"derived_key", ctx.derived_key},
                      {"attempt", std::to_string(ctx.attempt)},
                      {"outcome", ToString(r.outcome)},
                      {"http_status", std::to_string(r.http_status)},
                      {"detail", r.detail},
                      {"trace_id", ctx.trace.trace_id}});
}

// A step function that throws is a bug or a library failure; it cannot have been applied
// with certainty either way, so it counts as in doubt (retry with the same key).
StepResult Call(const StepFn& fn, StepContext& ctx) {
  try {
    return fn(ctx);
  } catch (const std::exception& e) {
    return StepResult::InDoubt(std::string("step threw: ") + e.what());
  }
}

void Record(common::trace::Span& span, const StepResult& r) {
  span.Set("outcome", std::string(ToString(r.outcome)));
  if (r.http_status != 0) span.Set("http.status_code", static_cast<long long>(r.http_status));
  if (r.replayed) span.Set("replayed", true);
  if (r.outcome == Outcome::kSucceeded) {
    span.Ok();
  } else {
    span.Error(r.detail.empty() ? ToString(r.outcome) : r.detail);
  }
}

}  // namespace

StepContext Runner::Context(const StepDefinition& step, const SagaInput& input,
                            const nlohmann::json& outputs, const std::string& key) const {
  StepContext ctx;
  ctx.saga_name = definition_.name();
  ctx.saga_version = definition_.version();
  ctx.step_name = step.name;
  ctx.tenant_id = input.tenant_id;
  ctx.parent_key = input.parent_key;
  ctx.derived_key = key;
  ctx.action_key = ActionKey(input.parent_key, step.name);
  ctx.request = &input.request;
  ctx.outputs = &outputs;
  ctx.input = input.typed;
  ctx.steps = &definition_.steps();
  ctx.call_timeout = step.policy.call_timeout.value_or(std::chrono::milliseconds(0));
  ctx.trace = {input.trace_id, common::trace::NewSpanId()};
  return ctx;
}

StepResult Runner::Act(const StepDefinition& step, const SagaInput& input,
                       const nlohmann::json& outputs, StepRecord& record,
                       std::vector<StepRecord>& all, Journal& journal,
                       std::optional<SagaEnd>& interrupted,
                       const common::trace::SpanContext& saga_span) const {
  const RetryPolicy policy = policy_.For(step.policy);
  // The deadline counts from the first attempt ever sent, by this owner or one before it
  // (a parked or taken-over step goes on where it stood).
  const long long now_ms = NowUnixMs();
  if (record.first_attempt_unix_ms == 0) record.first_attempt_unix_ms = now_ms;
  auto deadline = SteadyNow() + policy.step_deadline -
                  std::chrono::milliseconds(now_ms - record.first_attempt_unix_ms);
  StepContext ctx = Context(step, input, outputs, record.action_key);
  auto step_span = StartSpan("step " + step.name, saga_span, input);
  step_span.Set("step", step.name).Set("derived_key", record.action_key);
  if (step.group >= 0) step_span.Set("parallel_group", definition_.steps()[step.group].name);
  ctx.deadline = deadline;
  bool in_doubt = record.maybe_applied;
  StepResult last = StepResult::Retryable("not attempted");
  for (int attempt = record.attempts + 1; attempt <= policy.max_attempts; ++attempt) {
    if (!journal.KeepLease()) {
      interrupted = SagaEnd::kFenced;
      return last;
    }
    ctx.attempt = attempt;
    ctx.trace.parent_span_id = common::trace::NewSpanId();
    record.attempts = attempt;
    auto attempt_span = StartAttemptSpan(step.name + " attempt", step_span.context(), ctx);
    last = Call(step.action, ctx);
    if (last.outcome == Outcome::kSucceeded && step.parse_output) {
      try {
        step.parse_output(last.output);
      } catch (const std::exception& e) {
        // Applied, with an answer this build cannot read: neither new nor undone on a guess.
        in_doubt = true;
        last = StepResult::Blocked(last.http_status,
                                   std::string("the step's answer does not parse: ") + e.what());
      }
    }
    Boundary("after_step_sent");
    CountAttempt(step.name, "action", last.outcome);
    // A step that succeeds at once is in the trace and in saga_finished: a line is for what
    // an operator looks into (retries, failures), and lines cost a write each on the hot path.
    if (last.outcome != Outcome::kSucceeded || attempt > 1) LogStep("step_outcome", ctx, last);
    Record(attempt_span, last);
    step_span.Set("attempts", static_cast<long long>(attempt));
    if (last.outcome == Outcome::kSucceeded || last.outcome == Outcome::kTerminal) {
      Record(step_span, last);
      return last;
    }
    in_doubt = in_doubt || last.outcome == Outcome::kInDoubt;
    if (last.outcome == Outcome::kBlocked) {
      // A configuration fault decides nothing about the order: wait, visibly, for a fix. Its
      // deadline starts again once fixed (time spent blocked is not the participant's).
      record.detail = last.detail;
      record.maybe_applied = in_doubt;
      record.first_attempt_unix_ms = 0;
      Record(step_span, last);
      interrupted = Defer(input, step.name, last.detail, all, journal);
      return last;
    }
    // A shutdown decides nothing either: the next owner goes on from here.
    if (should_stop_()) {
      interrupted = SagaEnd::kAbandoned;
      return last;
    }
    const auto now = SteadyNow();
    if (attempt == policy.max_attempts || now >= deadline) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    record.maybe_applied = in_doubt;
    record.detail = last.detail;
    if (auto stop = Backoff(policy, attempt, std::min(last.retry_after, left), input, all, journal,
                            last.busy)) {
      interrupted = stop;
      return last;
    }
    if (should_stop_()) {
      interrupted = SagaEnd::kAbandoned;
      return last;
    }
  }
  // Once any attempt may have been applied, the step stays "possibly applied".
  if (in_doubt) last.outcome = Outcome::kInDoubt;
  Record(step_span, last);
  return last;
}

std::optional<SagaEnd> Runner::Compensate(const StepDefinition& step, const SagaInput& input,
                                          const nlohmann::json& outputs, StepRecord& record,
                                          std::vector<StepRecord>& all, Journal& journal,
                                          const common::trace::SpanContext& saga_span) const {
  const RetryPolicy policy = policy_.For(step.policy);
  StepContext ctx = Context(step, input, outputs, CompensationKey(input.parent_key, step.name));
  // action_confirmed is kept beside kCompensating (see RunSteps) for exactly this.
  ctx.action_confirmed = record.action_confirmed;
  auto step_span = StartSpan("compensate " + step.name, saga_span, input);
  step_span.Set("step", step.name).Set("derived_key", ctx.derived_key).Set("compensation", true);
  for (;;) {
    if (should_stop_()) return SagaEnd::kAbandoned;
    if (!journal.KeepLease()) return SagaEnd::kFenced;
    ctx.attempt = ++record.compensation_attempts;
    ctx.trace.parent_span_id = common::trace::NewSpanId();
    ctx.deadline = SteadyNow() + policy.step_deadline;
    auto attempt_span =
        StartAttemptSpan(step.name + " compensation attempt", step_span.context(), ctx);
    attempt_span.Set("compensation", true);
    StepResult r = Call(step.compensation, ctx);
    CountAttempt(step.name, "compensation", r.outcome);
    LogStep("compensation_outcome", ctx, r);
    Record(attempt_span, r);
    step_span.Set("attempts", static_cast<long long>(record.compensation_attempts));
    if (r.outcome == Outcome::kSucceeded) {
      step_span.Ok();
      record.status = StepStatus::kCompensated;
      record.detail.clear();
      CountCompensation(step.name, "undone");
      return std::nullopt;
    }
    record.detail = r.detail;
    if (r.outcome != Outcome::kBlocked &&
        record.compensation_attempts < policy.compensation_stuck_after) {
      if (auto stop = Backoff(policy, record.compensation_attempts, r.retry_after, input, all,
                              journal, r.busy)) {
        return stop;
      }
      continue;
    }
    step_span.Error("stuck after " + std::to_string(record.compensation_attempts) + " attempts")
        .Set("stuck", true);
    CountCompensation(step.name, "stuck");
    return Defer(input, step.name, r.detail, all, journal);
  }
}

}  // namespace idemsaga::steps::saga
