// Runner::RunChild and Runner::CompensateChild: a saga run as one step of another, by a
// runner of its own whose journal is the parent's, with the child's records kept in the
// parent's step record.
#include <algorithm>
#include <functional>
#include <stdexcept>

#include "common/log.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {
namespace {

// The child's view of the parent's journal: the lease, cancels and events are the parent's;
// whatever the child makes durable (a park, a deferral) is written as the parent's, with the
// child's records in the parent's step record. The child's decision to compensate is the
// parent's too (a child that fails fails its parent): `begin_compensation` commits it as the
// parent's before the child sends any compensation.
class ChildJournal : public Journal {
 public:
  using Begin = std::function<bool(const StepResult& cause)>;
  ChildJournal(Journal& parent, StepRecord& record, std::vector<StepRecord>& all, Begin begin)
      : parent_(parent), record_(record), all_(all), begin_(std::move(begin)) {}

  bool KeepLease() override { return parent_.KeepLease(); }
  std::chrono::milliseconds KeepLeaseEvery() const override { return parent_.KeepLeaseEvery(); }
  bool BeginCompensation(const std::vector<StepRecord>& steps, const StepResult& cause,
                         const std::string&) override {
    Keep(steps);
    return begin_(cause);
  }
  bool CancelRequested() override { return parent_.CancelRequested(); }
  bool DeferStuck(const std::vector<StepRecord>& steps,
                  std::chrono::milliseconds retry_in) override {
    Keep(steps);
    return parent_.DeferStuck(all_, retry_in);
  }
  ParkResult Park(const std::vector<StepRecord>& steps,
                  std::chrono::milliseconds wake_in) override {
    Keep(steps);
    return parent_.Park(all_, wake_in);
  }
  std::optional<ReceivedEvent> Event(const std::vector<std::string>& names) override {
    return parent_.Event(names);
  }
  AwaitResult AwaitEvent(const std::vector<StepRecord>& steps,
                         const std::vector<std::string>& names,
                         std::chrono::milliseconds wake_in) override {
    Keep(steps);
    return parent_.AwaitEvent(all_, names, wake_in);
  }

  // The child's records, in the parent's step record (what a resumed parent goes on from).
  void Keep(const std::vector<StepRecord>& steps) {
    nlohmann::json records = nlohmann::json::array();
    for (const auto& s : steps) records.push_back(s.ToJson());
    if (!record_.output.is_object()) record_.output = nlohmann::json::object();
    record_.output["steps"] = std::move(records);
  }

 private:
  Journal& parent_;
  StepRecord& record_;
  std::vector<StepRecord>& all_;
  Begin begin_;
};

// The child's run: its key and trace, its spans under `step_span`.
SagaInput ChildInput(const StepDefinition& step, const SagaInput& parent,
                     const common::trace::Span& step_span) {
  SagaInput child;
  child.tenant_id = parent.tenant_id;
  child.parent_key = ActionKey(parent.parent_key, step.name);
  child.trace_id = parent.trace_id;
  child.root_span_id = step_span.context().span_id;
  return child;
}

std::vector<StepRecord> RecordsIn(const nlohmann::json& output) {
  std::vector<StepRecord> out;
  if (!output.is_object() || !output.contains("steps")) return out;
  for (const auto& s : output["steps"]) out.push_back(StepRecord::FromJson(s));
  return out;
}

}  // namespace

StepResult Runner::RunChild(const StepDefinition& step, const SagaInput& input,
                            const nlohmann::json& outputs, StepRecord& record,
                            std::vector<StepRecord>& all, Journal& journal,
                            std::optional<SagaEnd>& interrupted,
                            std::vector<std::string>& waiting_for, bool& parent_compensating,
                            const common::trace::SpanContext& saga_span) const {
  const Definition& child_def = *step.child;
  auto span = StartSpan("step " + step.name, saga_span, input);
  span.Set("step", step.name).Set("child_saga", child_def.name());
  SagaInput child = ChildInput(step, input, span);
  child.resumed = input.resumed;
  child.answer_by = input.answer_by;
  if (!record.output.is_object()) record.output = nlohmann::json::object();
  if (record.output.contains("request")) {
    child.request = record.output["request"];  // as it started, whatever has changed since
  } else {
    try {
      StepContext ctx = Context(step, input, outputs, "");
      child.request = step.child_input(ctx);
    } catch (const std::exception& e) {
      std::string why = std::string("the child saga's input did not compute: ") + e.what();
      interrupted = Defer(input, step.name, why, all, journal);
      return StepResult::Blocked(0, why);
    }
    record.output["saga"] = child_def.name();
    record.output["request"] = child.request;
  }
  try {
    if (auto records = RecordsIn(record.output); !records.empty()) child.checkpoint = records;
  } catch (const std::exception& e) {
    std::string why = std::string("the child saga's checkpoint does not read: ") + e.what();
    interrupted = Defer(input, step.name, why, all, journal);
    return StepResult::Blocked(0, why);
  }
  // The child's decision to compensate, committed as the parent's: this step and every step
  // before it that was or may have been applied are to be undone.
  // The records themselves are marked, not a copy: a park or a deferral while the child
  // undoes itself writes them again, and must keep what is to be undone.
  auto begin = [&](const StepResult& cause) {
    const auto& defs = definition_.steps();
    for (size_t j = 0; j < all.size(); ++j) {
      bool applied = all[j].status == StepStatus::kSucceeded ||
                     all[j].status == StepStatus::kInDoubt || &all[j] == &record;
      if (applied && j < defs.size() && defs[j].Compensable()) {
        all[j].status = StepStatus::kCompensating;
      }
    }
    StepResult failure = cause;
    failure.outcome = Outcome::kTerminal;
    if (!journal.BeginCompensation(all, failure, step.name)) return false;
    parent_compensating = true;
    return true;
  };
  ChildJournal child_journal(journal, record, all, begin);
  Runner runner(child_def, policy_, sleep_, should_stop_, tracer_, metrics_, now_, at_boundary_);
  SagaResult r = runner.Run(std::move(child), child_journal);
  child_journal.Keep(r.steps);
  record.output["outputs"] = r.outputs;
  switch (r.end) {
    case SagaEnd::kCompleted: {
      span.Ok();
      return StepResult::Succeeded(record.output);
    }
    case SagaEnd::kFailed: {
      // The child has undone its own steps: from here, nothing of it is applied.
      StepResult failed = r.failure;
      failed.outcome = Outcome::kTerminal;
      if (failed.detail.empty()) failed.detail = "the child saga " + child_def.name() + " failed";
      span.Error(failed.detail);
      return failed;
    }
    default:
      interrupted = r.end;
      waiting_for = r.waiting_for;
      return StepResult::Retryable(std::string("child saga ") + ToString(r.end));
  }
}

std::optional<SagaEnd> Runner::CompensateChild(const StepDefinition& step, const SagaInput& input,
                                               const nlohmann::json& outputs, StepRecord& record,
                                               std::vector<StepRecord>& all, Journal& journal,
                                               const common::trace::SpanContext& saga_span) const {
  const Definition& child_def = *step.child;
  auto span = StartSpan("compensate " + step.name, saga_span, input);
  span.Set("step", step.name).Set("child_saga", child_def.name()).Set("compensation", true);
  SagaInput child = ChildInput(step, input, span);
  child.resumed = true;
  if (!record.output.is_object()) record.output = nlohmann::json::object();
  std::vector<StepRecord> records;
  try {
    records = RecordsIn(record.output);
    if (record.output.contains("request")) {
      child.request = record.output["request"];
    } else {
      StepContext ctx = Context(step, input, outputs, "");
      child.request = step.child_input(ctx);
    }
  } catch (const std::exception& e) {
    return Defer(input, step.name, std::string("the child saga cannot be undone: ") + e.what(), all,
                 journal);
  }
  // No records: an earlier owner may have run the child before a crash (a cancel of a resumed
  // parent). Every call of it may have been applied, so every one is undone; a compensation
  // of an action never received leaves a tombstone and changes nothing else.
  if (records.empty()) {
    for (const auto& s : child_def.steps()) {
      StepRecord r;
      r.name = s.name;
      if (s.Compensable()) {
        r.action_key = ActionKey(child.parent_key, s.name);
        r.status = StepStatus::kInDoubt;
      }
      records.push_back(r);
    }
  }
  for (auto& r : records) {
    const auto& defs = child_def.steps();
    auto def = std::find_if(defs.begin(), defs.end(),
                            [&](const StepDefinition& d) { return d.name == r.name; });
    // A step this build does not define stays to be undone: the child's runner says so.
    bool undo = def == defs.end() || def->Compensable();
    // Every call not known to have applied nothing: one that was retrying when the child
    // parked may have been applied (a compensation of an action never received leaves a
    // tombstone and changes nothing else).
    bool settled = r.status == StepStatus::kCompensated || r.status == StepStatus::kFailed ||
                   r.status == StepStatus::kSkipped;
    if (undo && !settled) r.status = StepStatus::kCompensating;
  }
  child.compensating = records;
  // Never an answer: the parent's own failure is what its client gets.
  child.failure = StepResult::Retryable("the parent saga failed; its child is undone");
  child.failed_step = step.name;
  ChildJournal child_journal(journal, record, all,
                             [](const StepResult&) { return true; });  // decided already
  child_journal.Keep(records);
  Runner runner(child_def, policy_, sleep_, should_stop_, tracer_, metrics_, now_, at_boundary_);
  SagaResult r = runner.Run(std::move(child), child_journal);
  child_journal.Keep(r.steps);
  if (r.end != SagaEnd::kFailed) return r.end;  // stopped: fenced, abandoned or stuck
  record.status = StepStatus::kCompensated;
  record.detail.clear();
  span.Ok();
  return std::nullopt;
}

}  // namespace idemsaga::steps::saga
