// Runs a saga Definition: each step's action in order, retried with the same derived key;
// on a definite failure, the decision to compensate is made durable first, then every step
// that was or may have been applied is compensated in reverse order of completion, each retried
// until it succeeds. The branches of a parallel group run on threads of their own and end
// together before the saga goes on. After RetryPolicy::compensation_stuck_after attempts the saga
// is marked stuck and deferred: the journal pushes its lease out by stuck_retry_interval and the
// run returns, so a recovery sweeper (in any replica) retries it at that slower pace. Never
// dropped.
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
#include <string_view>
#include <vector>

#include "common/metrics.hpp"
#include "common/trace/span.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::steps::saga {

// Defaults are documented in docs/orders.md ("Retries"). They ride out a participant restart:
// the deadline, not the attempt count, ends a step's retries (past the response budget the
// client already holds a 202, so a long deadline costs it nothing).
struct RetryPolicy {
  int max_attempts = 1000;                         // per action, the first included
  std::chrono::milliseconds initial_backoff{100};  // full jitter: sleep U(0, min(max, b*2^n))
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::milliseconds step_deadline{120000};       // no new action attempt after this
  int compensation_stuck_after = 8;                      // attempts before the saga shows as stuck
  std::chrono::milliseconds stuck_retry_interval{5000};  // pace once stuck
  // A wait at least this long (a backoff, a participant's Retry-After) holds no thread: the
  // saga is parked (its steps checkpointed, its lease pushed to the wake-up time) and any
  // replica's recovery sweeper resumes it when due. Shorter waits are slept. 0: never park.
  std::chrono::milliseconds park_after{1000};

  // This policy with a step's overrides.
  RetryPolicy For(const StepPolicy& step) const;
};

// The longest a run of `definition` is expected to last before it ends or shows as stuck: its
// steps' own deadlines (and waits, and children) end to end, a parallel group as its longest
// branch (participants must keep their keys longer than the orchestrator's retention plus this).
std::chrono::milliseconds LongestRun(const RetryPolicy& policy, const Definition& definition);

// Where one step stands. Stored by name (ToString) in the saga's row and shown by the API.
enum class StepStatus {
  kNotRun,
  kSucceeded,     // the action answered 2xx
  kFailed,        // a definite refusal: nothing was applied
  kInDoubt,       // it may have been applied
  kCompensating,  // to be undone (it succeeded or may have)
  kCompensated,   // undone
  kWaiting,       // a timer or an event wait that has not ended (the saga is parked)
  kSkipped,       // its condition (Definition::When) did not hold: never run
};
const char* ToString(StepStatus status);
// The status stored as `name`; nullopt for a name this build does not know.
std::optional<StepStatus> ParseStepStatus(std::string_view name);

// What happened to one step; persisted with the saga (JSON) and shown by the API.
struct StepRecord {
  std::string name;
  std::string action_key;  // "" for a wait (a timer, an event), which calls no participant
  StepStatus status = StepStatus::kNotRun;
  int attempts = 0;
  int compensation_attempts = 0;
  bool replayed = false;
  // The action answered 2xx (not merely "may have been applied"); kept once compensating.
  bool action_confirmed = false;
  nlohmann::json output;
  std::string detail;
  // When the action was first sent (Unix ms; 0: not yet), and whether an attempt may have
  // applied it: kept across a park or a takeover, so that a resumed step keeps its deadline
  // and its doubt instead of starting over.
  long long first_attempt_unix_ms = 0;
  bool maybe_applied = false;
  // A parallel branch's place in the order its group's branches ended (1, 2, ...; 0: not a
  // branch, or not ended): compensations run in the reverse of it.
  int finish_order = 0;

  nlohmann::json ToJson() const;
  // Throws std::invalid_argument (or nlohmann::json::exception) on a record this build
  // cannot read: resuming from a guess could undo the wrong thing.
  static StepRecord FromJson(const nlohmann::json& j);
};
// A run's records as they are stored: an array of ToJson()s.
nlohmann::json ToJson(const std::vector<StepRecord>& steps);

// How the step answer that decided to compensate is stored while a saga compensates, both
// directions. A stored failure this build cannot read comes back retryable ("unknown"): it
// only words the final answer, it never decides what is undone.
nlohmann::json FailureToJson(const StepResult& failure);
StepResult FailureFromJson(const nlohmann::json& j);

// The indices of `steps` (a saga's records, in its definition's order) in the order their
// compensations run: the reverse of the order the steps ended, a parallel group's branches by
// finish_order (one that had not ended counts as ending last). Without the definition
// (nullptr), plain reverse order.
std::vector<size_t> UndoOrder(const std::vector<StepRecord>& steps, const Definition* definition);

enum class SagaEnd {
  kCompleted,  // every action succeeded
  kFailed,     // a step failed for good and the applied steps were compensated
  kFenced,     // the lease was lost: another owner has the saga; nothing more was written
  kAbandoned,  // stopped on shutdown, deciding nothing; another owner resumes it as it is
  // Stuck, to be retried by recovery later: a compensation keeps failing, a step is blocked
  // on a configuration fault, or the step to undo is not defined by this build.
  kDeferred,
  // Waiting (RetryPolicy::park_after) with its steps checkpointed and no thread held:
  // recovery resumes it when its lease runs out at the wake-up time.
  kParked,
};

const char* ToString(SagaEnd end);

// The refusal a cancelled saga ends with (409 saga_cancelled), blamed on the step it did not
// run.
StepResult CancelledByOperator();

struct SagaResult {
  SagaEnd end = SagaEnd::kAbandoned;
  std::vector<StepRecord> steps;
  StepResult failure;                    // kFailed: the step answer that decided it
  std::string failed_step;               // kFailed (and compensating): which step
  std::vector<std::string> compensated;  // step names, in the order they were compensated
  nlohmann::json outputs = nlohmann::json::object();  // step name -> output
  std::vector<std::string> waiting_for;  // kParked on an event wait: the events it awaits
  std::optional<SuccessAnswer> answer;   // kCompleted, when the definition declares one
};

// An external event delivered to a run (the journal's store keeps each name once per run).
struct ReceivedEvent {
  std::string name;
  nlohmann::json payload;
};

// The runner's durable side, fenced by the saga's lease.
class Journal {
 public:
  virtual ~Journal() = default;
  // Renews the lease when due. False: the lease is lost; stop.
  virtual bool KeepLease() = 0;
  // How often KeepLease must be asked while the saga waits: well under the lease (a wait
  // sliced more coarsely than a short lease loses it, and another owner starts over).
  virtual std::chrono::milliseconds KeepLeaseEvery() const { return std::chrono::seconds(2); }
  // Commits `compensating` with the steps to undo before any compensation is sent.
  virtual bool BeginCompensation(const std::vector<StepRecord>& steps, const StepResult& cause,
                                 const std::string& failed_step) = 0;
  // Whether an operator asked to cancel the saga: asked at every step boundary, where a
  // cancelled saga stops and compensates what ran (as if the next step had been refused).
  virtual bool CancelRequested() { return false; }
  // Marks the saga stuck (visible in the API, metrics and the log) and lets its lease run
  // out after `retry_in`, when recovery picks it up again. False: fenced.
  virtual bool DeferStuck(const std::vector<StepRecord>& steps,
                          std::chrono::milliseconds retry_in) = 0;
  // Checkpoints `steps` and lets the lease run out after `wake_in`, when recovery (in any
  // replica) resumes the saga; the runner then returns and frees its thread.
  enum class ParkResult { kParked, kFenced, kUnsupported };
  virtual ParkResult Park(const std::vector<StepRecord>& /*steps*/,
                          std::chrono::milliseconds /*wake_in*/) {
    return ParkResult::kUnsupported;  // a journal that cannot park: the runner sleeps instead
  }
  // The event of `names` this run's wait takes: the one it took before (a resumed run decides
  // as the owner before it did), else the first delivered, from now on taken; nullopt while
  // none has come.
  virtual std::optional<ReceivedEvent> Event(const std::vector<std::string>& /*names*/) {
    return std::nullopt;
  }
  // Parks as Park does until `wake_in`, and also until one of `names` is delivered: a
  // delivery wakes the saga (any replica resumes it). kArrived: one was delivered while
  // parking, and this owner still holds the saga and goes on.
  enum class AwaitResult { kParked, kFenced, kArrived, kUnsupported };
  virtual AwaitResult AwaitEvent(const std::vector<StepRecord>& /*steps*/,
                                 const std::vector<std::string>& /*names*/,
                                 std::chrono::milliseconds /*wake_in*/) {
    return AwaitResult::kUnsupported;  // the runner polls Event() instead
  }
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
  // Set when resuming a running saga that checkpointed its steps (parked, or deferred): their
  // attempts, first-attempt times and doubt carry over (the actions are re-sent: replayed).
  std::optional<std::vector<StepRecord>> checkpoint;
  std::optional<StepResult> failure;
  std::string failed_step;
  // When a client is waiting for this run's answer on the thread that runs it (the request
  // that started it), until when: a wait that ends before then is slept, so a short outage
  // still ends in the client's 201; a wait past it is parked. Unset: no one waits here.
  std::chrono::steady_clock::time_point answer_by{};
  // The typed input (Definition::ParseInput of `request`); parsed by the runner when null.
  std::shared_ptr<const std::any> typed;
};

// What a runner counts (labels are the definition's saga and step names, never a key):
//   idemsaga_step_attempts_total{saga,step,kind="action"|"compensation",outcome}
//   idemsaga_compensations_total{saga,step,outcome="undone"|"stuck"}
struct RunnerMetrics {
  explicit RunnerMetrics(common::metrics::Registry& registry);
  common::metrics::Family<common::metrics::Counter>& attempts;
  common::metrics::Family<common::metrics::Counter>& compensations;
};

class Runner {
 public:
  using Sleep = std::function<void(std::chrono::milliseconds)>;
  using ShouldStop = std::function<bool()>;
  // The wall clock the runner reads (timers, event-wait timeouts, a step's deadline across
  // parks). Unset: std::chrono::system_clock::now(). A virtual clock that `sleep` advances
  // runs a saga's waits in no real time (idemsaga/testing.hpp).
  using Now = std::function<std::chrono::system_clock::time_point()>;
  // Told each boundary of a run where a crash leaves the most to recover, by name:
  //   after_step_sent           an action was sent (answered or not), before it is recorded
  //   after_step_answer         an action succeeded, before the next step
  //   after_compensating        the decision to compensate is stored, before any compensation
  //   between_compensations     one compensation done, another still to send
  //   between_parallel_branches one branch of a group ended, a sibling may still run
  // A fault-injection build (the stock binary's, cmd/idemsaga/crash_points.hpp) kills the
  // process here; the library installs none. Called on the run's threads (a parallel branch's
  // under the group's lock): it must not call back into the runner.
  using AtBoundary = std::function<void(std::string_view point)>;

  // `tracer` may be null (no spans), and `metrics` (nothing counted); `at_boundary` unset
  // (the default): no boundary is reported.
  Runner(const Definition& definition, RetryPolicy policy, Sleep sleep = {},
         ShouldStop should_stop = {}, const common::trace::Tracer* tracer = nullptr,
         const RunnerMetrics* metrics = nullptr, Now now = {}, AtBoundary at_boundary = {});

  // Parses `input.request` into the definition's typed input when `input.typed` is null; a
  // stored request that no longer parses is deferred (stuck), never run.
  SagaResult Run(SagaInput input, Journal& journal) const;

  // Longest sleep between two lease checks while waiting to retry: well under a third of any
  // sensible lease, so a saga that waits (a long Retry-After) keeps its lease.
  static constexpr std::chrono::milliseconds kLeaseCheckEvery{2000};
  // How often an event wait asks a journal that cannot park (Journal::AwaitEvent) for events.
  static constexpr std::chrono::milliseconds kEventPollEvery{250};

  const Definition& definition() const { return definition_; }

 private:
  // `interrupted` is set when the step neither succeeded nor failed: kFenced, kAbandoned
  // (shutdown) or kDeferred (blocked; the journal has marked the saga stuck).
  StepResult Act(const StepDefinition& step, const SagaInput& input, const nlohmann::json& outputs,
                 StepRecord& record, std::vector<StepRecord>& all, Journal& journal,
                 std::optional<SagaEnd>& interrupted,
                 const common::trace::SpanContext& saga_span) const;
  // Marks the saga stuck for `why` and defers it: kDeferred, or kFenced.
  SagaEnd Defer(const SagaInput& input, const std::string& step, const std::string& why,
                std::vector<StepRecord>& all, Journal& journal) const;
  SagaResult RunSteps(const SagaInput& input, Journal& journal,
                      const common::trace::SpanContext& saga_span) const;
  // Runs the parallel group of steps [first, last) whose branches are still to run (their
  // conditions asked) until each has ended. nullopt: they have; result.failed_step names the
  // one that failed first, if one did. Otherwise why the run stops: kFenced, kAbandoned,
  // kDeferred or kParked (the group's records checkpointed).
  std::optional<SagaEnd> RunGroup(size_t first, size_t last, const SagaInput& input,
                                  SagaResult& result, Journal& journal,
                                  const common::trace::SpanContext& saga_span) const;
  // nullopt when undone; otherwise why it stopped: kFenced, kAbandoned or kDeferred.
  std::optional<SagaEnd> Compensate(const StepDefinition& step, const SagaInput& input,
                                    const nlohmann::json& outputs, StepRecord& record,
                                    std::vector<StepRecord>& all, Journal& journal,
                                    const common::trace::SpanContext& saga_span) const;
  StepContext Context(const StepDefinition& step, const SagaInput& input,
                      const nlohmann::json& outputs, const std::string& key) const;
  // Waits before the next attempt: sleeps (keeping the lease), or parks the saga when the
  // wait is at least park_after and ends past the response budget, or whenever `busy` (the
  // last try was turned away by a bulkhead). nullopt: go on; else why the run stops (kFenced,
  // kParked).
  std::optional<SagaEnd> Backoff(const RetryPolicy& policy, int attempt,
                                 std::chrono::milliseconds at_least, const SagaInput& input,
                                 const std::vector<StepRecord>& all, Journal& journal,
                                 bool busy = false) const;
  // Waits `left`: parked by Backoff's rule, else slept keeping the lease.
  std::optional<SagaEnd> Pause(std::chrono::milliseconds left, const SagaInput& input,
                               const std::vector<StepRecord>& all, Journal& journal,
                               bool busy = false) const;
  // A timer step and an event wait; `interrupted` as for Act (and kParked).
  StepResult Timer(const StepDefinition& step, const SagaInput& input,
                   const nlohmann::json& outputs, StepRecord& record, std::vector<StepRecord>& all,
                   Journal& journal, std::optional<SagaEnd>& interrupted) const;
  StepResult AwaitEvent(const StepDefinition& step, const SagaInput& input,
                        const nlohmann::json& outputs, StepRecord& record,
                        std::vector<StepRecord>& all, Journal& journal,
                        std::optional<SagaEnd>& interrupted,
                        std::vector<std::string>& waiting_for) const;
  // A child saga (StepKind::kChild), run by a runner of its own under this one's journal;
  // `interrupted` as for AwaitEvent. And its compensation: as Compensate answers.
  StepResult RunChild(const StepDefinition& step, const SagaInput& input,
                      const nlohmann::json& outputs, StepRecord& record,
                      std::vector<StepRecord>& all, Journal& journal,
                      std::optional<SagaEnd>& interrupted, std::vector<std::string>& waiting_for,
                      bool& parent_compensating, const common::trace::SpanContext& saga_span) const;
  std::optional<SagaEnd> CompensateChild(const StepDefinition& step, const SagaInput& input,
                                         const nlohmann::json& outputs, StepRecord& record,
                                         std::vector<StepRecord>& all, Journal& journal,
                                         const common::trace::SpanContext& saga_span) const;
  common::trace::Span StartSpan(const std::string& name, const common::trace::SpanContext& parent,
                                const SagaInput& input) const;
  common::trace::Span StartAttemptSpan(const std::string& name,
                                       const common::trace::SpanContext& parent,
                                       const StepContext& ctx) const;

  // The wall clock (now_, or the system's), in Unix ms; and the steady clock a step's
  // deadline is counted on: the system's, or now_'s when it is set (one timeline).
  std::chrono::system_clock::time_point SystemNow() const;
  long long NowUnixMs() const;
  std::chrono::steady_clock::time_point SteadyNow() const;

  void Boundary(std::string_view point) const {
    if (at_boundary_) at_boundary_(point);
  }

  const Definition& definition_;
  RetryPolicy policy_;
  Sleep sleep_;
  ShouldStop should_stop_;
  Now now_;
  AtBoundary at_boundary_;
  void CountAttempt(const std::string& step, const char* kind, Outcome outcome) const;
  void CountCompensation(const std::string& step, const char* outcome) const;

  const common::trace::Tracer* tracer_;
  const RunnerMetrics* metrics_;
};

}  // namespace idemsaga::steps::saga
