// The participant protocol's vocabulary: what a guard says it did with a request (Outcome),
// what it keeps under a key (KeyStatus, KeyRecord), the problems it answers itself (Refusal),
// and where it serves its policy and its keys. One name table each, in the style of
// orchestrator/store/saga_status.hpp: the wire, the metrics and the stored rows use exactly
// these names. No database and no network here, so both sides include it: the guards
// (steps/guard, on PostgreSQL and on Redis), a store of its own (demo/redis_inventory.cpp), the
// step client (steps/client), the orchestrator's start-up check and its reconciler.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace idemsaga::steps::protocol {

// What the guard did with a request: for spans, logs, metrics (HttpGuard) and the
// compensation's answer ({"outcome": ...}).
enum class Outcome {
  kNone,  // not answered by a guard (an effect's own answer, before the guard stamps it)
  // An action's:
  kApplied,        // the effect ran now; its answer is stored
  kReplayed,       // the stored answer, again
  kReused,         // 422: the key was used with another request
  kCancelled,      // 409: a tombstone (its compensation came first); or a compensation
                   // that wrote one
  kCompensated,    // 409: undone by its compensation; no longer in effect
  kInProgress,     // 409 + Retry-After: a duplicate (or the action undone) still runs
  kActionUnknown,  // 409: a compensation of an applied action of which there is no record
  kFenced,         // an external call's answer not stored: its claim was taken over
  // A compensation's (in its answer's "outcome"):
  kUndone,
  kAlreadyUndone,
  kNothingToUndo,  // the action answered a non-2xx: there is nothing to undo
};

// The one table between an outcome and its name.
inline constexpr std::pair<Outcome, const char*> kOutcomeNames[] = {
    {Outcome::kNone, ""},
    {Outcome::kApplied, "applied"},
    {Outcome::kReplayed, "replayed"},
    {Outcome::kReused, "reused"},
    {Outcome::kCancelled, "cancelled"},
    {Outcome::kCompensated, "compensated"},
    {Outcome::kInProgress, "in_progress"},
    {Outcome::kActionUnknown, "action_unknown"},
    {Outcome::kFenced, "fenced"},
    {Outcome::kUndone, "undone"},
    {Outcome::kAlreadyUndone, "already_undone"},
    {Outcome::kNothingToUndo, "nothing_to_undo"},
};

constexpr const char* ToString(Outcome outcome) {
  for (const auto& [o, name] : kOutcomeNames) {
    if (o == outcome) return name;
  }
  return "unknown";
}

// nullopt for a name that is not an outcome.
constexpr std::optional<Outcome> ParseOutcome(std::string_view name) {
  for (const auto& [o, n] : kOutcomeNames) {
    if (name == n) return o;
  }
  return std::nullopt;
}

// The `outcome` label of idemsaga_guard_requests_total: the outcome's name, except that a
// tombstone (an action refused, or a compensation that wrote one) counts as "tombstoned".
constexpr const char* MetricLabel(Outcome outcome) {
  return outcome == Outcome::kCancelled ? "tombstoned" : ToString(outcome);
}

std::ostream& operator<<(std::ostream& out, Outcome outcome);  // its name (tests' messages)

// What a key holds, as the guard's `status` column (and the Redis record's) stores it.
enum class KeyStatus {
  kStarted,    // claimed by a transaction still running its effect (never seen committed)
  kCompleted,  // answered: the stored answer replays
  kTombstone,  // its compensation came first: a late action is refused
  kPending,    // an external call under a lease (RunExternal)
};

inline constexpr std::pair<KeyStatus, const char*> kKeyStatusNames[] = {
    {KeyStatus::kStarted, "started"},
    {KeyStatus::kCompleted, "completed"},
    {KeyStatus::kTombstone, "tombstone"},
    {KeyStatus::kPending, "pending"},
};

constexpr const char* ToString(KeyStatus status) {
  for (const auto& [s, name] : kKeyStatusNames) {
    if (s == status) return name;
  }
  return "unknown";
}

constexpr std::optional<KeyStatus> ParseKeyStatus(std::string_view name) {
  for (const auto& [s, n] : kKeyStatusNames) {
    if (name == n) return s;
  }
  return std::nullopt;
}

// A key as a reconciler sees it: what the guard stored under it, not the answer's bytes.
struct KeyRecord {
  std::string key;
  KeyStatus status = KeyStatus::kCompleted;  // completed | tombstone | pending
  int response_status = 0;   // the stored answer's (409 for a tombstone; 0 while pending)
  bool compensated = false;  // an action since undone by its compensation
  double age_seconds = 0;    // since it was first written

  // An action whose 2xx answer is stored (it took effect, unless since compensated).
  bool Applied() const {
    return status == KeyStatus::kCompleted && response_status >= 200 && response_status < 300;
  }

  // {"key", "status", "response_status", "compensated", "age_seconds"}: one of kKeysPath's
  // "keys".
  nlohmann::json ToJson() const;
  // The inverse; throws std::invalid_argument (or nlohmann::json's errors) for anything else.
  static KeyRecord FromJson(const nlohmann::json& json);
};

// The problem codes a guard answers itself (docs/errors.md), with their HTTP status.
enum class GuardCode {
  kInProgress,     // 409 idempotency_key_in_progress: retry later (Retry-After)
  kKeyReused,      // 422 idempotency_key_reused: never stored
  kCancelled,      // 409: a tombstone refuses the action
  kCompensated,    // 409: the action was undone
  kActionUnknown,  // 409: nothing to undo, of an action the caller saw applied
};

struct GuardCodeEntry {
  GuardCode code;
  int status;
  const char* name;
};

// Status before name, as tests/unit/problem_codes_test.cpp finds an emitted code.
inline constexpr GuardCodeEntry kGuardCodes[] = {
    {GuardCode::kInProgress, 409, "idempotency_key_in_progress"},
    {GuardCode::kKeyReused, 422, "idempotency_key_reused"},
    {GuardCode::kCancelled, 409, "cancelled"},
    {GuardCode::kCompensated, 409, "compensated"},
    {GuardCode::kActionUnknown, 409, "action_unknown"},
};

constexpr const GuardCodeEntry& Describe(GuardCode code) {
  for (const auto& e : kGuardCodes) {
    if (e.code == code) return e;
  }
  return kGuardCodes[0];
}
constexpr const char* ToString(GuardCode code) { return Describe(code).name; }
constexpr int HttpStatus(GuardCode code) { return Describe(code).status; }

// Statuses the guard answers itself (never stored): key reused with another request, or a
// concurrent duplicate still running past the lock timeout.
inline constexpr int kKeyReusedStatus = HttpStatus(GuardCode::kKeyReused);
inline constexpr int kInProgressStatus = HttpStatus(GuardCode::kInProgress);
// An action whose compensation has undone it: its success is never replayed again.
inline constexpr int kCompensatedStatus = HttpStatus(GuardCode::kCompensated);
// A compensation for an action the caller saw succeed, of which there is no record here
// (never stored: the retry after the record is restored undoes it).
inline constexpr int kActionUnknownStatus = HttpStatus(GuardCode::kActionUnknown);

// Every problem a guard answers of its own: the situation, its code, its outcome and its
// detail. The one message table: the PostgreSQL guard and the Redis store both answer from it.
enum class Refusal {
  kKeyReused,       // the key came with another request
  kKeyPending,      // an external call under a live lease holds the key
  kKeyBusy,         // Duplicates::kFailFast: another request holds the key's lock
  kKeyLockTimeout,  // a duplicate held the key past the lock timeout
  kActionPending,   // a compensation's action is an external call still out
  kClaimTakenOver,  // this request's external claim was taken over meanwhile
  kCompensated,     // a retry of an action its compensation undid
  kCutOff,          // an external action cut off mid-call by its compensation (stored)
  kTombstone,       // an action whose compensation came first (stored under its key)
  kActionUnknown,   // a compensation of an applied action of which there is no record
};

struct RefusalEntry {
  Refusal refusal;
  GuardCode code;
  Outcome outcome;
  const char* detail;
};

inline constexpr RefusalEntry kRefusals[] = {
    {Refusal::kKeyReused, GuardCode::kKeyReused, Outcome::kReused,
     "this Idempotency-Key was used with a different request"},
    {Refusal::kKeyPending, GuardCode::kInProgress, Outcome::kInProgress,
     "a request with this Idempotency-Key is still running; retry later"},
    {Refusal::kKeyBusy, GuardCode::kInProgress, Outcome::kInProgress,
     "a request with this Idempotency-Key is being processed right now; retry later"},
    {Refusal::kKeyLockTimeout, GuardCode::kInProgress, Outcome::kInProgress,
     "a request with this Idempotency-Key is still being processed; retry later"},
    {Refusal::kActionPending, GuardCode::kInProgress, Outcome::kInProgress,
     "the action this compensation undoes is still running; retry later"},
    {Refusal::kClaimTakenOver, GuardCode::kInProgress, Outcome::kFenced,
     "this request's claim was taken over; retry later"},
    {Refusal::kCompensated, GuardCode::kCompensated, Outcome::kCompensated,
     "this action was compensated (undone); it is no longer in effect"},
    {Refusal::kCutOff, GuardCode::kCompensated, Outcome::kCompensated,
     "this action was cut off mid-call and compensated; it is not in effect"},
    {Refusal::kTombstone, GuardCode::kCancelled, Outcome::kCancelled,
     "this step was compensated before it arrived; it will not be applied"},
    {Refusal::kActionUnknown, GuardCode::kActionUnknown, Outcome::kActionUnknown,
     "the action this compensation undoes succeeded, but there is no record of it here; "
     "nothing was undone or stored"},
};

constexpr const RefusalEntry& Describe(Refusal refusal) {
  for (const auto& e : kRefusals) {
    if (e.refusal == refusal) return e;
  }
  return kRefusals[0];
}

// The one table between a refusal and its name: how a store that decides outside C++ (the
// Redis guard's scripts) names the refusal it found, for Refuse to word.
inline constexpr std::pair<Refusal, const char*> kRefusalNames[] = {
    {Refusal::kKeyReused, "key_reused"},
    {Refusal::kKeyPending, "key_pending"},
    {Refusal::kKeyBusy, "key_busy"},
    {Refusal::kKeyLockTimeout, "key_lock_timeout"},
    {Refusal::kActionPending, "action_pending"},
    {Refusal::kClaimTakenOver, "claim_taken_over"},
    {Refusal::kCompensated, "compensated"},
    {Refusal::kCutOff, "cut_off"},
    {Refusal::kTombstone, "tombstone"},
    {Refusal::kActionUnknown, "action_unknown"},
};

constexpr const char* ToString(Refusal refusal) {
  for (const auto& [r, name] : kRefusalNames) {
    if (r == refusal) return name;
  }
  return "unknown";
}

constexpr std::optional<Refusal> ParseRefusal(std::string_view name) {
  for (const auto& [r, n] : kRefusalNames) {
    if (name == n) return r;
  }
  return std::nullopt;
}

// A compensation's answer body: {"action_key", "outcome": ToString(outcome), ...detail} (the
// fields of `detail`, an object, after them; anything else adds nothing). Every store answers
// a compensation with it.
std::string CompensationBody(const std::string& action_key, Outcome outcome,
                             const nlohmann::json& detail);

// Where a participant serves {"key_retention_seconds": N} (service token), for the
// orchestrator's start-up check.
inline constexpr const char* kPolicyPath = "/v1/idempotency";
// Where a reconciler reads a tenant's recent keys (HttpGuard::Keys):
// {"keys": [KeyRecord...], "next": the last key, or null at the end}.
inline constexpr const char* kKeysPath = "/v1/idempotency/keys";

}  // namespace idemsaga::steps::protocol
