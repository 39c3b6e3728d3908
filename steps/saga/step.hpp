// What a saga step is given and what it answers.
//
// A step's action and compensation are callables `StepResult(StepContext&)`. The result says
// what the runner should do next: go on, retry with the same key, give up (compensate), or
// treat the call as possibly applied (retry with the same key; compensate if it never settles).
// Plain values; not shared between threads.
#pragma once

#include <any>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace saga {

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

}  // namespace saga
