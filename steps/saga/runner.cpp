#include "steps/saga/runner.hpp"

// The runner itself: construction, clocks, spans and counts, and Run with its step loop and the
// compensation loop. A step's attempts are step_attempts.cpp, the waits between them
// retries.cpp, timers and event waits waits.cpp, what a run records records.cpp, parallel
// groups parallel_group.cpp and child sagas child_saga.cpp.
#include <algorithm>
#include <stdexcept>
#include <thread>

#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/trace/trace_context.hpp"
#include "steps/saga/run_clock.hpp"

namespace idemsaga::steps::saga {

using detail::Clock;
using detail::ToUnixMs;

RunnerMetrics::RunnerMetrics(common::metrics::Registry& registry)
    : attempts(registry.Counter("idemsaga_step_attempts_total",
                                "Calls to a participant, by saga, step, kind (action or "
                                "compensation) and outcome.",
                                {"saga", "step", "kind", "outcome"})),
      compensations(registry.Counter(
          "idemsaga_compensations_total",
          "Compensations by how they ended: undone, or stuck (deferred to recovery).",
          {"saga", "step", "outcome"})) {}

Runner::Runner(const Definition& definition, RetryPolicy policy, Sleep sleep,
               ShouldStop should_stop, const common::trace::Tracer* tracer,
               const RunnerMetrics* metrics, Now now, AtBoundary at_boundary)
    : definition_(definition),
      policy_(policy),
      sleep_(sleep ? std::move(sleep)
                   : [](std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }),
      should_stop_(should_stop ? std::move(should_stop) : [] { return false; }),
      now_(std::move(now)),
      at_boundary_(std::move(at_boundary)),
      tracer_(tracer),
      metrics_(metrics) {}

std::chrono::system_clock::time_point Runner::SystemNow() const {
  return now_ ? now_() : std::chrono::system_clock::now();
}

long long Runner::NowUnixMs() const { return ToUnixMs(SystemNow()); }

Clock::time_point Runner::SteadyNow() const {
  return now_ ? Clock::time_point(
                    std::chrono::duration_cast<Clock::duration>(now_().time_since_epoch()))
              : Clock::now();
}

void Runner::CountAttempt(const std::string& step, const char* kind, Outcome outcome) const {
  if (metrics_ != nullptr) {
    metrics_->attempts.With({definition_.name(), step, kind, ToString(outcome)}).Inc();
  }
}

void Runner::CountCompensation(const std::string& step, const char* outcome) const {
  if (metrics_ != nullptr) {
    metrics_->compensations.With({definition_.name(), step, outcome}).Inc();
  }
}

common::trace::Span Runner::StartSpan(const std::string& name,
                                      const common::trace::SpanContext& parent,
                                      const SagaInput& input) const {
  if (tracer_ == nullptr) return {};
  auto span = tracer_->Start(name, parent);
  span.Set("tenant", input.tenant_id).Set("idempotency_key", input.parent_key);
  return span;
}

// The attempt's span id is the one the step sends in `traceparent`, so the participant's
// spans become its children.
common::trace::Span Runner::StartAttemptSpan(const std::string& name,
                                             const common::trace::SpanContext& parent,
                                             const StepContext& ctx) const {
  if (tracer_ == nullptr) return {};
  auto span = tracer_->StartWithId(name, parent, ctx.trace.parent_span_id,
                                   common::trace::SpanKind::kClient);
  span.Set("tenant", ctx.tenant_id)
      .Set("idempotency_key", ctx.parent_key)
      .Set("step", ctx.step_name)
      .Set("derived_key", ctx.derived_key)
      .Set("attempt", static_cast<long long>(ctx.attempt));
  return span;
}

SagaEnd Runner::Defer(const SagaInput& input, const std::string& step, const std::string& why,
                      std::vector<StepRecord>& all, Journal& journal) const {
  common::Log("saga_stuck", {{"tenant", input.tenant_id},
                             {"key", input.parent_key},
                             {"step", step},
                             {"detail", why},
                             {"retry_in_ms", std::to_string(policy_.stuck_retry_interval.count())},
                             {"trace_id", input.trace_id}});
  return journal.DeferStuck(all, policy_.stuck_retry_interval) ? SagaEnd::kDeferred
                                                               : SagaEnd::kFenced;
}

SagaResult Runner::Run(SagaInput input, Journal& journal) const {
  auto saga_span =
      StartSpan("saga " + definition_.name(), {input.trace_id, input.root_span_id}, input);
  saga_span.Set("saga", definition_.name())
      .Set("saga.version", static_cast<long long>(definition_.version()))
      .Set("resumed", input.resumed);
  SagaResult result;
  try {
    if (!input.typed) input.typed = definition_.ParseInput(input.request);
  } catch (const std::exception& e) {
    // Validated at the route when it started: a stored request this build reads otherwise.
    // Running anything could undo the wrong thing; it waits, visibly, for an operator.
    std::vector<StepRecord> none;
    result.end = Defer(input, "", std::string("the stored input does not parse: ") + e.what(),
                       input.compensating ? *input.compensating : none, journal);
    return result;
  }
  result = RunSteps(input, journal, saga_span.context());
  if (result.end == SagaEnd::kCompleted && definition_.answer()) {
    std::string why;
    try {
      StepContext ctx;
      ctx.saga_name = definition_.name();
      ctx.saga_version = definition_.version();
      ctx.tenant_id = input.tenant_id;
      ctx.parent_key = input.parent_key;
      ctx.request = &input.request;
      ctx.outputs = &result.outputs;
      ctx.input = input.typed;
      ctx.steps = &definition_.steps();
      ctx.trace = {input.trace_id, ""};
      result.answer = definition_.answer()(ctx);
      (void)result.answer->body.dump();  // throws on text JSON cannot carry (invalid UTF-8)
      if (result.answer->status < 200 || result.answer->status > 299) {
        why = "the saga's answer has status " + std::to_string(result.answer->status) +
              "; a completed saga answers 2xx";
      }
    } catch (const std::exception& e) {
      why = std::string("the saga's answer did not compute: ") + e.what();
    }
    if (!why.empty()) {
      // Every step is done and checkpointed: a build whose answer computes finishes it.
      result.answer.reset();
      result.end = Defer(input, "", why, result.steps, journal);
    }
  }
  saga_span.Set("outcome", std::string(ToString(result.end)));
  if (result.end == SagaEnd::kCompleted) {
    saga_span.Ok();
  } else if (result.end == SagaEnd::kFailed) {
    saga_span.Error(result.failed_step + ": " + result.failure.detail);
  }
  return result;
}

SagaResult Runner::RunSteps(const SagaInput& input, Journal& journal,
                            const common::trace::SpanContext& saga_span) const {
  SagaResult result;
  const auto& defs = definition_.steps();
  if (input.compensating) {
    result.steps = *input.compensating;
    result.failure = input.failure.value_or(StepResult::Retryable("resumed"));
    result.failed_step = input.failed_step;
    // Compensations resumed after a crash, a takeover or a deferral see the same outputs
    // as the first owner's did.
    for (const auto& s : result.steps) {
      if (!s.output.is_null()) result.outputs[s.name] = s.output;
    }
  } else {
    for (const auto& s : defs) {
      StepRecord r;
      r.name = s.name;
      // A wait calls no participant: it has no key.
      if (s.kind == StepKind::kCall) r.action_key = ActionKey(input.parent_key, s.name);
      // What a parked (or deferred) run had checkpointed: a step that succeeded is not sent
      // again (its recorded output is what the participant would replay); the step it waited
      // on goes on with its attempts, clock and doubt.
      if (input.checkpoint) {
        for (const auto& c : *input.checkpoint) {
          if (c.name != s.name || c.action_key != r.action_key) continue;
          if ((c.status == StepStatus::kSucceeded && c.action_confirmed) ||
              c.status == StepStatus::kSkipped) {
            r = c;
            result.outputs[s.name] = c.output;
          } else {
            r.attempts = c.attempts;
            r.first_attempt_unix_ms = c.first_attempt_unix_ms;
            r.maybe_applied = c.maybe_applied || c.status == StepStatus::kInDoubt;
            if (s.kind == StepKind::kChild) r.output = c.output;  // the child's checkpoint
          }
        }
      }
      result.steps.push_back(r);
    }
    bool decided_by_child = false;  // a failed child committed the decision to compensate
    for (size_t i = 0; i < defs.size(); ++i) {
      if (should_stop_()) return result;  // kAbandoned
      // A parallel group is one step boundary: [i, end).
      size_t end = i + 1;
      while (defs[i].group >= 0 && end < defs.size() && defs[end].group == defs[i].group) ++end;
      bool runs_any = false;
      std::string condition_error;
      std::vector<size_t> skipped;  // applied only once every branch's condition has answered
      for (size_t j = i; j < end; ++j) {
        auto& record = result.steps[j];
        if (record.status == StepStatus::kSucceeded || record.status == StepStatus::kSkipped) {
          continue;  // checkpointed
        }
        if (defs[j].when) {
          StepContext ctx = Context(defs[j], input, result.outputs, record.action_key);
          bool runs = true;
          try {
            runs = defs[j].when(ctx);
          } catch (const std::exception& e) {
            condition_error = std::string("the step's condition threw: ") + e.what();
            break;
          }
          if (!runs) {
            skipped.push_back(j);
            continue;
          }
        }
        runs_any = true;
      }
      if (condition_error.empty()) {
        for (size_t j : skipped) result.steps[j].status = StepStatus::kSkipped;
      }
      if (!runs_any && condition_error.empty()) {
        i = end - 1;
        continue;
      }
      // A step its condition skips is no boundary: a cancel that comes after the last step
      // that runs is too late, as one during that step is.
      if (journal.CancelRequested()) {
        common::Log("saga_cancelled", {{"tenant", input.tenant_id},
                                       {"key", input.parent_key},
                                       {"step", defs[i].name},
                                       {"trace_id", input.trace_id}});
        // A resumed saga re-runs its steps from the first: an earlier owner may have sent the
        // ones this run has not reached, so those are undone too (a compensation of an action
        // that never arrived leaves a tombstone and changes nothing else).
        if (input.resumed) {
          for (size_t j = i; j < result.steps.size(); ++j) {
            if (defs[j].Compensable() && result.steps[j].status != StepStatus::kSucceeded &&
                result.steps[j].status != StepStatus::kSkipped) {
              result.steps[j].status = StepStatus::kInDoubt;
            }
          }
        }
        result.failure = CancelledByOperator();
        result.failed_step = defs[i].name;
        break;
      }
      // Stuck until fixed, but never past a cancel (checked first: the step has not run).
      if (!condition_error.empty()) {
        result.end = Defer(input, defs[i].name, condition_error, result.steps, journal);
        return result;
      }
      if (defs[i].group >= 0) {
        if (auto stop = RunGroup(i, end, input, result, journal, saga_span)) {
          result.end = *stop;
          return result;
        }
        if (!result.failed_step.empty()) break;
        i = end - 1;
        continue;
      }
      auto& record = result.steps[i];
      std::optional<SagaEnd> interrupted;
      StepResult r = StepResult::Retryable("not run");
      switch (defs[i].kind) {
        case StepKind::kCall:
          r = Act(defs[i], input, result.outputs, record, result.steps, journal, interrupted,
                  saga_span);
          break;
        case StepKind::kTimer:
          r = Timer(defs[i], input, result.outputs, record, result.steps, journal, interrupted);
          break;
        case StepKind::kEvent:
          r = AwaitEvent(defs[i], input, result.outputs, record, result.steps, journal, interrupted,
                         result.waiting_for);
          break;
        case StepKind::kChild:
          r = RunChild(defs[i], input, result.outputs, record, result.steps, journal, interrupted,
                       result.waiting_for, decided_by_child, saga_span);
          break;
      }
      if (interrupted) {
        result.end = *interrupted;
        return result;
      }
      record.replayed = r.replayed;
      if (r.outcome == Outcome::kSucceeded) {
        record.status = StepStatus::kSucceeded;
        record.action_confirmed = true;
        record.output = r.output;
        result.outputs[defs[i].name] = r.output;
        Boundary("after_step_answer");
        continue;
      }
      // A definite refusal applied nothing; anything else may have been applied.
      record.status = r.outcome == Outcome::kTerminal ? StepStatus::kFailed : StepStatus::kInDoubt;
      record.detail = r.detail;
      result.failure = r;
      result.failed_step = defs[i].name;
      break;
    }
    if (result.failed_step.empty()) {
      result.end = SagaEnd::kCompleted;
      return result;
    }
    for (size_t i = 0; i < result.steps.size(); ++i) {
      auto& s = result.steps[i];
      if (!defs[i].Compensable()) continue;  // a wait: nothing to undo
      if (s.status == StepStatus::kSucceeded || s.status == StepStatus::kInDoubt) {
        s.status = StepStatus::kCompensating;
      }
    }
    // A child that failed has committed this decision already, as this saga's.
    if (!decided_by_child &&
        !journal.BeginCompensation(result.steps, result.failure, result.failed_step)) {
      result.end = SagaEnd::kFenced;
      return result;
    }
    Boundary("after_compensating");
  }
  const auto order = UndoOrder(result.steps, &definition_);
  for (size_t n = 0; n < order.size(); ++n) {
    auto& record = result.steps[order[n]];
    if (record.status != StepStatus::kCompensating) continue;
    auto def = std::find_if(defs.begin(), defs.end(),
                            [&](const StepDefinition& d) { return d.name == record.name; });
    if (def == defs.end()) {
      // Skipping it would leave its effect in place while the saga says "failed".
      result.end = Defer(input, record.name,
                         "step '" + record.name + "' is not defined by this build of saga '" +
                             definition_.name() + "'; its compensation cannot run",
                         result.steps, journal);
      return result;
    }
    if (auto stopped = def->kind == StepKind::kChild
                           ? CompensateChild(*def, input, result.outputs, record, result.steps,
                                             journal, saga_span)
                           : Compensate(*def, input, result.outputs, record, result.steps, journal,
                                        saga_span)) {
      result.end = *stopped;
      return result;
    }
    // Only where another compensation follows: the point is a saga half undone.
    bool more =
        std::any_of(order.begin() + static_cast<std::ptrdiff_t>(n) + 1, order.end(),
                    [&](size_t k) { return result.steps[k].status == StepStatus::kCompensating; });
    if (more) Boundary("between_compensations");
  }
  // In the order undone, including steps compensated by an earlier owner before a crash.
  for (size_t k : order) {
    if (result.steps[k].status == StepStatus::kCompensated) {
      result.compensated.push_back(result.steps[k].name);
    }
  }
  result.end = SagaEnd::kFailed;
  return result;
}

}  // namespace idemsaga::steps::saga
