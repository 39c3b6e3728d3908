// A saga declared in code: a name, a version, a typed input and an ordered list of steps. A
// step is an action and the compensation that undoes it, with an optional policy of its own;
// or a durable wait: a timer (Sleep, SleepUntil) or named external events (Await) with a
// timeout. Any step may run only when a condition on the input and earlier outputs holds
// (When); otherwise it is recorded `skipped`. The runner does the mechanics (derived keys,
// retries, compensation in reverse, recording and persisting outputs, parking a saga that
// waits so that it holds no thread); a definition only says what each step does. Calls may run
// side by side in a parallel group (Parallel), each under its own derived key.
//
// Immutable once built; safe to share between threads.
//   auto def = saga::Definition("ship_order", /*version=*/1)
//       .Input<ShipOrder>(ParseShipOrder)
//       .Step("inventory", reserve, release)
//       .Await("approval", {.events = {"approved", "rejected"}, .timeout = 24h,
//                           .decide = approved_or_refused})
//       .When([](const saga::StepContext& ctx) { return ctx.Input<ShipOrder>().total > 1000; })
//       .Step("shipping", ship, cancel, {.call_timeout = std::chrono::seconds(2)});
#pragma once

#include <any>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "steps/saga/step.hpp"

namespace saga {

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
  // the field (saga::Fields makes that short). Steps read it as ctx.Input<T>(). Without this,
  // the input is the JSON body as it came (ctx.Input<nlohmann::json>()).
  template <typename T>
  Definition& Input(std::function<T(const nlohmann::json&)> parse) {
    parse_ = [parse = std::move(parse)](const nlohmann::json& body) {
      return std::make_shared<const std::any>(parse(body));
    };
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

 private:
  std::string name_;
  int version_;
  std::function<std::shared_ptr<const std::any>(const nlohmann::json&)> parse_;
  std::vector<StepDefinition> steps_;
  AnswerFn answer_;

  Definition& Add(StepDefinition step);
  Definition& TypeOutput(OutputParser parse);
};

}  // namespace saga
