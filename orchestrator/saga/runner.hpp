// Runs a saga Definition: each step's action in order, retried with the same derived key;
// on a definite failure, the decision to compensate is made durable first, then every step
// that was or may have been applied is compensated in reverse order, each retried until it
// succeeds. After RetryPolicy::compensation_stuck_after attempts the saga is marked stuck and
// deferred: the journal pushes its lease out by stuck_retry_interval and the run returns, so a
// recovery sweeper (in any replica) retries it at that slower pace. Never dropped.
//
// The runner makes no network calls itself (the steps do) and holds no transaction; its
// durable side is the Journal, fenced by lease: when the journal reports the lease lost, the
// runner stops at once without writing anything else.
// One Runner may run many sagas concurrently (it is stateless); a Journal is per saga.
//   saga::Runner runner(def, policy);
//   saga::SagaResult r = runner.Run(input, journal);
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/trace/span.hpp"
#include "orchestrator/saga/definition.hpp"

namespace saga {

// Defaults are documented in the README ("Retries").
struct RetryPolicy {
  int max_attempts = 6;                           // per action, the first included
  std::chrono::milliseconds initial_backoff{50};  // full jitter: sleep U(0, min(max, b*2^n))
  std::chrono::milliseconds max_backoff{2000};
  std::chrono::milliseconds step_deadline{15000};        // no new action attempt after this
  int compensation_stuck_after = 8;                      // attempts before the saga shows as stuck
  std::chrono::milliseconds stuck_retry_interval{5000};  // pace once stuck
};

// What happened to one step; persisted with the saga (JSON) and shown by the API.
struct StepRecord {
  std::string name;
  std::string action_key;
  // not_run | succeeded | failed | in_doubt | compensated | compensating
  std::string status = "not_run";
  int attempts = 0;
  int compensation_attempts = 0;
  bool replayed = false;
  nlohmann::json output;
  std::string detail;

  nlohmann::json ToJson() const;
  static StepRecord FromJson(const nlohmann::json& j);
};

enum class SagaEnd {
  kCompleted,  // every action succeeded
  kFailed,     // a step failed for good and the applied steps were compensated
  kFenced,     // the lease was lost: another owner has the saga; nothing more was written
  kAbandoned,  // stopped on shutdown; the lease will expire and recovery resumes it
  kDeferred,   // a compensation keeps failing: marked stuck, to be retried by recovery later
};

struct SagaResult {
  SagaEnd end = SagaEnd::kAbandoned;
  std::vector<StepRecord> steps;
  StepResult failure;                    // kFailed: the step answer that decided it
  std::string failed_step;               // kFailed: which step
  std::vector<std::string> compensated;  // step names, in the order they were compensated
  nlohmann::json outputs = nlohmann::json::object();  // step name -> output
};

// The runner's durable side, fenced by the saga's lease.
class Journal {
 public:
  virtual ~Journal() = default;
  // Renews the lease when due. False: the lease is lost; stop.
  virtual bool KeepLease() = 0;
  // Commits `compensating` with the steps to undo before any compensation is sent.
  virtual bool BeginCompensation(const std::vector<StepRecord>& steps, const StepResult& cause,
                                 const std::string& failed_step) = 0;
  // Marks the saga stuck (visible in the API, metrics and the log) and lets its lease run
  // out after `retry_in`, when recovery picks it up again. False: fenced.
  virtual bool DeferStuck(const std::vector<StepRecord>& steps,
                          std::chrono::milliseconds retry_in) = 0;
};

struct SagaInput {
  std::string tenant_id;
  std::string parent_key;
  nlohmann::json request;
  std::string trace_id;
  std::string root_span_id;  // the order request's span: the saga span's parent
  bool resumed = false;      // taken over from another owner (recovery)
  // Set when resuming a saga that had already decided to compensate: its recorded steps.
  std::optional<std::vector<StepRecord>> compensating;
  std::optional<StepResult> failure;
  std::string failed_step;
};

class Runner {
 public:
  using Sleep = std::function<void(std::chrono::milliseconds)>;
  using ShouldStop = std::function<bool()>;

  // `tracer` may be null (no spans).
  Runner(const Definition& definition, RetryPolicy policy, Sleep sleep = {},
         ShouldStop should_stop = {}, const common::trace::Tracer* tracer = nullptr);

  SagaResult Run(const SagaInput& input, Journal& journal) const;

  const Definition& definition() const { return definition_; }

 private:
  StepResult Act(const StepDefinition& step, const SagaInput& input, const nlohmann::json& outputs,
                 StepRecord& record, Journal& journal, bool& fenced,
                 const common::trace::SpanContext& saga_span) const;
  SagaResult RunSteps(const SagaInput& input, Journal& journal,
                      const common::trace::SpanContext& saga_span) const;
  // kCompleted when undone; otherwise why it stopped: kFenced, kAbandoned or kDeferred.
  SagaEnd Compensate(const StepDefinition& step, const SagaInput& input,
                     const nlohmann::json& outputs, StepRecord& record,
                     std::vector<StepRecord>& all, Journal& journal,
                     const common::trace::SpanContext& saga_span) const;
  StepContext Context(const StepDefinition& step, const SagaInput& input,
                      const nlohmann::json& outputs, const std::string& key) const;
  void Backoff(int attempt) const;
  common::trace::Span StartSpan(const std::string& name, const common::trace::SpanContext& parent,
                                const SagaInput& input) const;
  common::trace::Span StartAttemptSpan(const std::string& name,
                                       const common::trace::SpanContext& parent,
                                       const StepContext& ctx) const;

  const Definition& definition_;
  RetryPolicy policy_;
  Sleep sleep_;
  ShouldStop should_stop_;
  const common::trace::Tracer* tracer_;
};

}  // namespace saga
