// Define sagas: a name, a version, a typed input, and steps, each an action and the
// compensation that undoes it, run with derived idempotency keys at the participants they
// call. A step may also be a durable timer, a wait for external events, a parallel group, a
// child saga, or run only when a condition holds. The engine does the mechanics (derived keys,
// retries, compensation in reverse, persisting outputs, parking waits without a thread); a
// definition says only what each step does.
//
// A step's request must be a pure function of the saga's input and earlier steps' outputs:
// after a crash or a takeover every unfinished step is sent again under the same key, and a
// participant answers a key sent with another body with 422 idempotency_key_reused, which
// stops the saga (stuck) for an operator. No timestamps, random ids or clock reads in a body;
// idemsaga::testing::CheckDeterministic (idemsaga/testing.hpp) checks it by building every
// request twice, and idemsaga::testing::CheckCrashes shows what a crash at each step then does.
//
//   #include <idemsaga/saga.hpp>
//   idemsaga::Definition MakeTripSaga(idemsaga::Participants& participants) {
//     auto& hotel = participants.Get("hotel");
//     return idemsaga::Definition("trip", 1)
//         .Input<Trip>(ParseTrip)
//         .Step("hotel",
//               [&](idemsaga::StepContext& ctx) { return hotel.Post("/v1/bookings", ctx, {...}); },
//               [&](idemsaga::StepContext& ctx) { return hotel.Compensate("/v1/bookings/cancel",
//               ctx); });
//   }
//
// Part of idemsaga's public API (CHANGELOG.md says what may change between versions).
#pragma once

#include <any>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace idemsaga {

struct StepDefinition;

enum class Outcome {
  kSucceeded,  // done; `output` is kept for later steps and the response
  kRetryable,  // certainly not applied, or may be retried safely (connect error, 5xx, 409 busy)
  kTerminal,   // a definite business answer (declined, out of stock): compensate
  kInDoubt,    // the request was sent and no answer came: it may have been applied
  // Not an answer about the business at all (a wrong token or URL, a protocol error, a
  // participant that lost the record of an applied action): deciding anything would be
  // wrong, so the saga waits visibly (stuck) until an operator fixes it, then goes on.
  kBlocked,
};

const char* ToString(Outcome o);

struct [[nodiscard]] StepResult {
  Outcome outcome = Outcome::kRetryable;
  nlohmann::json output;   // kSucceeded: the participant's answer
  std::string detail;      // human-readable reason for anything but success
  int http_status = 0;     // the participant's status, when there was one
  std::string error_code;  // the participant's error code, when there was one
  bool replayed = false;   // the participant answered from its stored response
  // The participant's Retry-After: the runner waits at least this long before the next try.
  std::chrono::milliseconds retry_after{0};
  // Not sent: the participant is at the caller's limit of calls in flight (a bulkhead). The
  // wait before the next try is parked whatever its length, never slept on a thread: a
  // thread held for a saturated participant is what the limit is there to prevent.
  bool busy = false;

  static StepResult Succeeded(nlohmann::json output, bool replayed = false);
  static StepResult Retryable(std::string detail, int http_status = 0);
  static StepResult Terminal(int http_status, std::string error_code, std::string detail);
  static StepResult InDoubt(std::string detail);
  static StepResult Blocked(int http_status, std::string detail);
};

// The W3C trace context of the step call (filled in by the runner).
struct TraceContext {
  std::string trace_id;        // 32 hex
  std::string parent_span_id;  // 16 hex
  std::string Traceparent() const;
};

struct StepContext {
  std::string saga_name;
  int saga_version = 1;
  std::string step_name;
  std::string tenant_id;
  std::string parent_key;
  std::string derived_key;  // "A-inventory", or "A-inventory-compensate"
  std::string action_key;   // the action's key (what a compensation undoes)
  // For a compensation: the action answered 2xx, so it certainly happened (a participant
  // that says it never saw it has lost its record, which must not count as undone).
  bool action_confirmed = false;
  const nlohmann::json* request = nullptr;  // the parent request body, as stored
  const nlohmann::json* outputs = nullptr;  // earlier steps' outputs, by step name
  // The typed input (Definition::Input): parsed once per run, from the stored request.
  std::shared_ptr<const std::any> input;
  // The saga's steps, for typed outputs (Definition::Output).
  const std::vector<StepDefinition>* steps = nullptr;
  TraceContext trace;
  std::chrono::steady_clock::time_point deadline;  // of this attempt's step
  // When the saga first reached this step (kept across parks, restarts and takeovers): what
  // a timer counts from.
  std::chrono::system_clock::time_point arrived_at;
  // This call's own limit (StepPolicy::call_timeout); zero: the participant client's.
  std::chrono::milliseconds call_timeout{0};
  int attempt = 1;

  // The saga's input as its definition typed it; std::bad_any_cast for another type (a bug).
  template <typename T>
  const T& Input() const {
    return std::any_cast<const T&>(*input);
  }
  // What step `name` answered (its output, the same after a crash or a takeover), or null
  // when it has not succeeded.
  const nlohmann::json& Output(std::string_view name) const;
  // The same, typed as the step declared it (Definition::Output<T>). Throws std::logic_error
  // when the step declares no type, std::out_of_range when it has no output (not succeeded),
  // std::bad_any_cast for another type than the declared one (a bug).
  template <typename T>
  T Output(std::string_view name) const {
    return std::any_cast<T>(*TypedOutput(name));
  }
  std::shared_ptr<const std::any> TypedOutput(std::string_view name) const;
};

using StepFn = std::function<StepResult(StepContext&)>;

// What one step overrides of the runner's RetryPolicy (runner.hpp); unset fields keep it.
struct StepPolicy {
  std::optional<int> max_attempts;  // per action, the first included
  std::optional<std::chrono::milliseconds> initial_backoff;
  std::optional<std::chrono::milliseconds> max_backoff;
  // No new action attempt after this; the client answers 202 long before.
  std::optional<std::chrono::milliseconds> step_deadline;
  // Each call's own limit (ctx.call_timeout), below the participant client's read timeout.
  std::optional<std::chrono::milliseconds> call_timeout;
  std::optional<int> compensation_stuck_after;
};

// Whether a step runs, decided from the input and earlier outputs (the same answer every time
// it is asked: a resumed saga asks again only for steps it had not reached).
using ConditionFn = std::function<bool(const StepContext&)>;
// When a timer step wakes, from the input, earlier outputs and ctx.arrived_at.
using WakeFn = std::function<std::chrono::system_clock::time_point(const StepContext&)>;

// A wait for named external events addressed to one run (POST
// /v1/runs/{saga}/{key}/events/{name}). The first of `events` received ends it; events that
// arrive before the run reaches the step are kept for it. Each name is awaited by one step.
struct EventWait {
  std::vector<std::string> events;  // 1..32 of [a-z0-9_] each
  // From when the step is first reached; then the wait fails with `on_timeout`.
  std::chrono::milliseconds timeout{std::chrono::minutes(15)};
  // Checks a posted event's payload; throws InvalidInput naming the field (400, nothing is
  // stored). Unset: any JSON value.
  std::function<void(const std::string& event, const nlohmann::json& payload)> validate;
  // What the event means: Succeeded(output) goes on; Terminal fails the saga, which
  // compensates the steps before. Unset: Succeeded({"event": name, "payload": payload}).
  std::function<StepResult(const std::string& event, const nlohmann::json& payload,
                           const StepContext& ctx)>
      decide;
  // The failure when no event came in time. Unset: 409 event_timeout.
  std::optional<StepResult> on_timeout;
};

// Types a step's output (Definition::Output); throws naming the field.
using OutputParser = std::function<std::shared_ptr<const std::any>(const nlohmann::json&)>;

// What a completed saga answers its client (and replays to every retry of the key).
struct SuccessAnswer {
  int status = 201;  // 2xx
  nlohmann::json body;
};
using AnswerFn = std::function<SuccessAnswer(const StepContext&)>;

enum class StepKind {
  kCall,   // an action with its compensation
  kTimer,  // waits until a time; nothing to compensate
  kEvent,  // waits for an event; nothing to compensate
  kChild,  // runs another saga; compensated by compensating it
};

class Definition;
// What a child saga is started with (its request body), from the input and earlier outputs.
using ChildInputFn = std::function<nlohmann::json(const StepContext&)>;

struct StepDefinition {
  std::string name;
  StepFn action;        // kCall
  StepFn compensation;  // kCall
  StepPolicy policy;
  StepKind kind = StepKind::kCall;
  ConditionFn when;                       // unset: always runs
  WakeFn wake_at;                         // kTimer
  std::shared_ptr<const EventWait> wait;  // kEvent
  // How long the step may wait (a timer's bound, an event wait's timeout): it adds to the
  // saga's longest run, which participants' key retention must cover.
  std::chrono::milliseconds longest_wait{0};
  // The index of the first step of this step's parallel group; -1: it runs alone.
  int group = -1;
  OutputParser parse_output;                // kCall; unset: the output is untyped JSON
  std::shared_ptr<const Definition> child;  // kChild
  ChildInputFn child_input;                 // kChild

  // Whether an applied step has something to undo.
  bool Compensable() const { return kind == StepKind::kCall || kind == StepKind::kChild; }
};

// One branch of a parallel group: a call as Step() takes it.
struct Branch {
  std::string name;
  StepFn action;
  StepFn compensation;
  StepPolicy policy = {};
};

// The input broke a rule; what() names the field ("address.country must be ...").
class InvalidInput : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Saga and step names are 1..32 of [a-z0-9_]: step names become key suffixes, and without '-'
// in them two different parent keys can never derive the same step key. "compensate" is
// reserved, since "A-inventory" + "-compensate" must not equal parent "A-inventory"'s step
// "compensate".
bool IsValidStepName(std::string_view name);

// The most bytes a saga's steps may add to its parent key ("-<step>-compensate", or
// "-<child>-<step>-compensate" through a child): a derived key is at most 255 bytes (the
// participants' limit) under a parent key of at most 200.
inline constexpr size_t kMaxKeySuffix = 55;

// "A" + "inventory" -> "A-inventory".
std::string ActionKey(std::string_view parent_key, std::string_view step);
// "A" + "inventory" -> "A-inventory-compensate".
std::string CompensationKey(std::string_view parent_key, std::string_view step);

class Definition {
 public:
  // Throws std::invalid_argument for a bad name or a version below 1.
  explicit Definition(std::string name, int version = 1);

  // The input's type: `parse` turns the request body into a T, or throws InvalidInput naming
  // the field (idemsaga::Fields makes that short). Steps read it as ctx.Input<T>(). Without this,
  // the input is the JSON body as it came (ctx.Input<nlohmann::json>()).
  template <typename T>
  Definition& Input(std::function<T(const nlohmann::json&)> parse) {
    parse_ = [parse = std::move(parse)](const nlohmann::json& body) {
      return std::make_shared<const std::any>(parse(body));
    };
    return *this;
  }

  // The JSON Schema of the input Input's parser reads, for the served /openapi.json (which
  // documents POST /v1/runs/{name} with it). Unset: {"type": "object"}. The parser, not the
  // schema, decides what is accepted.
  Definition& InputSchema(nlohmann::json schema) {
    input_schema_ = std::move(schema);
    return *this;
  }

  // The step added last (a call) answers a T: `parse` turns its output into one, or throws
  // naming the field. Later steps and every compensation read it as ctx.Output<T>(step). It
  // is parsed when the step succeeds: an answer that does not parse stops the saga, visibly
  // stuck, since the action was applied and nothing should be decided on a guess, until a
  // build that reads it resumes the saga. Throws std::logic_error before any step, or after
  // a wait.
  template <typename T>
  Definition& Output(std::function<T(const nlohmann::json&)> parse) {
    return TypeOutput([parse = std::move(parse)](const nlohmann::json& output) {
      return std::make_shared<const std::any>(parse(output));
    });
  }
  // What the saga answers once every step has succeeded: a 2xx status and a JSON body, from
  // the input and the outputs (ctx.Output, ctx.Input; ctx.parent_key is the request's key).
  // Unset: 201 with the outputs' `*_id` fields, the order id, the key and the trace id. One
  // that throws, or answers another status, leaves the saga stuck with every step done,
  // until a build whose answer computes resumes it.
  Definition& Answer(AnswerFn answer);

  // Throws std::invalid_argument for a bad or duplicate name, or a missing callable.
  Definition& Step(std::string name, StepFn action, StepFn compensation, StepPolicy policy = {});
  // A durable timer: the saga goes on `duration` after it first reaches this step. A wait of
  // RetryPolicy::park_after or more holds no thread, survives restarts and fires on any
  // replica (recovery's sweep: at most about a second late).
  Definition& Sleep(std::string name, std::chrono::milliseconds duration);
  // The same, until the time `until` computes (from the input and earlier outputs), and never
  // longer than `longest` after the step is reached: participants must keep their keys for
  // the saga's longest run, so a wait needs a bound.
  Definition& SleepUntil(std::string name, WakeFn until, std::chrono::milliseconds longest);
  // Runs `branches` (2..16 calls) concurrently, each under its own derived key; the saga goes
  // on once every branch has succeeded. A branch sees the outputs of the steps before the
  // group, never a sibling's. When one fails for good, the others send no further attempt,
  // and every branch that was or may have been applied is compensated with the steps before,
  // in the reverse order the branches finished. A branch that waits long (a backoff, a
  // Retry-After) parks the whole group once its siblings have ended; the branches that
  // succeeded are not sent again. Throws std::invalid_argument as Step() does, or for fewer
  // than 2 or more than 16 branches.
  Definition& Parallel(std::vector<Branch> branches);
  // Runs `child`, a saga of its own (a registered definition, or one built for this), as this
  // step, under the derived key "<parent key>-<name>": the child's steps have the keys
  // "<parent key>-<name>-<step>". Its request is `input(ctx)`, read by the child's Input
  // parser. The step succeeds when the child completes, with the output {"saga", "request",
  // "outputs": the child's outputs, "steps": its records}. When the child fails it has undone
  // its own steps, and this step fails with the child's answer (the saga compensates the
  // steps before). Compensating this step compensates the completed child, its steps in
  // reverse. A wait inside the child parks the parent, with the child's steps checkpointed in
  // this step's record; its spans hang under this step's. Throws std::invalid_argument for a
  // bad name, no input, or a nesting whose derived keys would pass kMaxKeySuffix.
  Definition& Child(std::string name, Definition child, ChildInputFn input);
  // Waits for one of `wait.events`, parked (no thread) until it arrives or times out.
  // Throws std::invalid_argument for a bad name, no events, or an event another step awaits.
  Definition& Await(std::string name, EventWait wait);
  // The step added last (every branch, when that was a parallel group) runs only when
  // `condition` holds; otherwise it is recorded `skipped` (and, never applied, never
  // compensated). Throws std::logic_error before any step.
  Definition& When(ConditionFn condition);

  // The longest suffix a step of this saga (a child's, at any depth) adds to the parent key.
  size_t LongestKeySuffix() const;
  // Every event a step of this saga (or of a child, at any depth) awaits.
  std::vector<std::string> Events() const;
  // The step that awaits `event` (a child's included); nullptr when none does.
  const StepDefinition* Awaiting(std::string_view event) const;

  // The typed input of `body`; throws InvalidInput.
  std::shared_ptr<const std::any> ParseInput(const nlohmann::json& body) const;

  const std::string& name() const { return name_; }
  int version() const { return version_; }
  const std::vector<StepDefinition>& steps() const { return steps_; }
  const AnswerFn& answer() const { return answer_; }
  const nlohmann::json& input_schema() const { return input_schema_; }

 private:
  std::string name_;
  int version_;
  std::function<std::shared_ptr<const std::any>(const nlohmann::json&)> parse_;
  std::vector<StepDefinition> steps_;
  AnswerFn answer_;
  nlohmann::json input_schema_ = {{"type", "object"}};

  Definition& Add(StepDefinition step);
  Definition& TypeOutput(OutputParser parse);
};

class Fields {
 public:
  // Throws InvalidInput unless `object` is a JSON object. `at` prefixes field names in
  // messages ("address.").
  explicit Fields(const nlohmann::json& object, std::string at = "");

  // A string of 1..max_length bytes without control characters (UTF-8 is kept as sent).
  std::string Text(const char* name, size_t max_length);
  // An integer (not 2.5, not 1e3) from lo to hi.
  long long Integer(const char* name, long long lo, long long hi);
  // Any JSON value, present (checked by the caller, e.g. with a wire schema of its own).
  const nlohmann::json& Raw(const char* name);
  // A nested object, read the same way (its Done() is the caller's to call).
  Fields Object(const char* name);
  // Throws InvalidInput for the first field that was not read.
  void Done() const;

 private:
  const nlohmann::json& Get(const char* name);
  [[noreturn]] void Fail(const char* name, const std::string& rule) const;

  const nlohmann::json& object_;
  std::string at_;
  std::set<std::string> read_;
};

// A participant as a saga's steps call it: a guarded service reached with the step's derived
// key, the tenant and the trace. Thread-safe. idemsaga's own is HTTP; the test kit's
// (idemsaga/testing.hpp) answers from a script.
class ParticipantClient {
 public:
  virtual ~ParticipantClient() = default;
  // POSTs `body` to `path` under the context's derived key, and says what came of it.
  virtual StepResult Post(const std::string& path, const StepContext& ctx,
                          const nlohmann::json& body) = 0;
  // POSTs the compensation of the context's action to `path`: {"action_key",
  // "action_applied"}, what every guarded compensation route takes.
  virtual StepResult Compensate(const std::string& path, const StepContext& ctx) = 0;
};

// The participants a saga may call, by name. Get throws std::out_of_range naming one that is
// not configured: a saga that calls it fails at start-up, not at its first run.
class Participants {
 public:
  virtual ~Participants() = default;
  virtual ParticipantClient& Get(const std::string& name) const = 0;
  virtual bool Has(const std::string& name) const = 0;
};

// Builds a saga over the configured participants, once, at start-up; nullopt: it is not served
// here (an optional participant it needs is not configured). A function that returns its
// Definition fits.
using SagaFactory = std::function<std::optional<Definition>(Participants&)>;

}  // namespace idemsaga
