#include "steps/saga/runner.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/log.hpp"
#include "common/strings.hpp"
#include "common/trace/trace_context.hpp"

namespace saga {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::system_clock::time_point FromUnixMs(long long ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

long long ToUnixMs(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

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

}  // namespace

std::vector<size_t> UndoOrder(const std::vector<StepRecord>& steps, const Definition* definition) {
  static const std::vector<StepDefinition> kNone;
  const auto& defs = definition != nullptr ? definition->steps() : kNone;
  std::vector<std::pair<std::pair<size_t, int>, size_t>> keyed;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool branch = i < defs.size() && defs[i].name == steps[i].name && defs[i].group >= 0;
    const size_t block = branch ? static_cast<size_t>(defs[i].group) : i;
    const int within = branch && steps[i].finish_order == 0 ? 1 << 30 : steps[i].finish_order;
    keyed.push_back({{block, within}, i});
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<size_t> order;
  order.reserve(keyed.size());
  for (const auto& [key, i] : keyed) order.push_back(i);
  return order;
}

RetryPolicy RetryPolicy::For(const StepPolicy& step) const {
  RetryPolicy p = *this;
  p.max_attempts = step.max_attempts.value_or(p.max_attempts);
  p.initial_backoff = step.initial_backoff.value_or(p.initial_backoff);
  p.max_backoff = step.max_backoff.value_or(p.max_backoff);
  p.step_deadline = step.step_deadline.value_or(p.step_deadline);
  p.compensation_stuck_after = step.compensation_stuck_after.value_or(p.compensation_stuck_after);
  return p;
}

namespace {

// The one table between a step status and its stored name.
constexpr std::pair<StepStatus, const char*> kStepStatusNames[] = {
    {StepStatus::kNotRun, "not_run"},
    {StepStatus::kSucceeded, "succeeded"},
    {StepStatus::kFailed, "failed"},
    {StepStatus::kInDoubt, "in_doubt"},
    {StepStatus::kCompensating, "compensating"},
    {StepStatus::kCompensated, "compensated"},
    {StepStatus::kWaiting, "waiting"},
    {StepStatus::kSkipped, "skipped"},
};

}  // namespace

const char* ToString(StepStatus status) {
  for (const auto& [s, name] : kStepStatusNames) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<StepStatus> ParseStepStatus(std::string_view name) {
  for (const auto& [s, n] : kStepStatusNames) {
    if (name == n) return s;
  }
  return std::nullopt;
}

nlohmann::json StepRecord::ToJson() const {
  nlohmann::json j = {{"name", name},
                      {"action_key", action_key},
                      {"status", ToString(status)},
                      {"attempts", attempts},
                      {"compensation_attempts", compensation_attempts},
                      {"replayed", replayed},
                      {"action_confirmed", action_confirmed}};
  if (!output.is_null()) j["output"] = output;
  if (!detail.empty()) j["detail"] = detail;
  if (first_attempt_unix_ms != 0) j["first_attempt_unix_ms"] = first_attempt_unix_ms;
  if (maybe_applied) j["maybe_applied"] = true;
  if (finish_order != 0) j["finish_order"] = finish_order;
  return j;
}

StepRecord StepRecord::FromJson(const nlohmann::json& j) {
  StepRecord r;
  r.name = j.value("name", "");
  r.action_key = j.value("action_key", "");
  std::string status = j.value("status", "not_run");
  auto parsed = ParseStepStatus(status);
  if (!parsed)
    throw std::invalid_argument("step '" + r.name + "' has unknown status '" + status + "'");
  r.status = *parsed;
  r.attempts = j.value("attempts", 0);
  r.compensation_attempts = j.value("compensation_attempts", 0);
  r.replayed = j.value("replayed", false);
  r.action_confirmed = j.value("action_confirmed", false);
  if (j.contains("output")) r.output = j["output"];
  r.detail = j.value("detail", "");
  r.first_attempt_unix_ms = j.value("first_attempt_unix_ms", 0LL);
  r.maybe_applied = j.value("maybe_applied", false);
  r.finish_order = j.value("finish_order", 0);
  return r;
}

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

namespace {

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

StepResult CancelledByOperator() {
  return StepResult::Terminal(409, "saga_cancelled",
                              "an operator cancelled this saga; the steps that ran were "
                              "compensated");
}

const char* ToString(SagaEnd end) {
  switch (end) {
    case SagaEnd::kCompleted:
      return "completed";
    case SagaEnd::kFailed:
      return "failed";
    case SagaEnd::kFenced:
      return "fenced";
    case SagaEnd::kAbandoned:
      return "abandoned";
    case SagaEnd::kDeferred:
      return "deferred";
    case SagaEnd::kParked:
      return "parked";
  }
  return "unknown";
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

}  // namespace saga
