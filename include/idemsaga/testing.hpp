// A test kit for a team's own saga definitions: runs a Definition with the real engine against
// scripted participants, an in-memory journal and a virtual clock. No PostgreSQL, no network,
// no real sleeping (after Temporal's TestWorkflowEnvironment and DBOS's testing guide).
//
// The contract:
// - Participants are fakes (FakeParticipants, an idemsaga::Participants): each answers a
//   derived key from a script, call by call (the n-th call of a key that reaches the script
//   takes the n-th reply; the last one repeats); an unscripted key succeeds with
//   {"<participant>_id": "<derived key>"}. Each is guarded as a real participant is: a key it
//   answered for good (a success, a refusal) is replayed to every later call with the same
//   path and body, and answered 422 step_request_changed (blocked) for another body. Every
//   call is recorded in order, across participants.
// - Time is virtual: backoffs, Retry-After, timers (Sleep, SleepUntil), event-wait timeouts and
//   a reply's delay advance the environment's clock, never the test's. A run that parks (a
//   long wait) is resumed from its checkpoint as recovery resumes it, at its wake-up time or
//   when an awaited event arrives; a run that is stuck is resumed RunOptions::stuck_retries
//   times, then reported stuck.
// - The journal keeps what the orchestrator's row would: the steps a park or a deferral
//   checkpoints, the decision to compensate, the events delivered and the one a wait took.
//   Records go through their JSON form, as they do through the database.
// - CheckCrashes kills the run at every crash point (each step boundary, each participant
//   call after the participant applied it and before its answer came back, and the moment the
//   decision to compensate is stored) and resumes it as a new owner would; CheckDeterministic sends
//   every request twice. Both report differences, and are empty when the saga is right.
// - Concurrent branches (Definition::Parallel) run on threads, as in production, and share
//   the clock: their waits add up, so times in a parallel group are an upper bound. Which
//   branch is sent first, ends first (the order they are undone in) or is still unsent when a
//   sibling fails varies from run to run; a check compares such runs as they came out.
//
//   #include <idemsaga/testing.hpp>
//   namespace t = idemsaga::testing;
//   t::Environment env;
//   env.participants().Add("hotel").Script("A-hotel", {t::Reply::Retryable(),
//                                                      t::Reply::Success({{"room", 12}})});
//   env.participants().Add("flight").Script("A-flight", {t::Reply::Refusal(409, "sold_out")});
//   idemsaga::Definition trip = MakeTripSaga(env.participants());
//   t::Result r = env.Run(trip, {{"city", "Oslo"}});
//   EXPECT_EQ(r.end, t::End::kFailed);
//   EXPECT_EQ(r.status, 409);
//   EXPECT_EQ(r.compensated, std::vector<std::string>{"hotel"});
//
//   t::CheckOptions check;
//   check.setup = [](t::Environment& e) { e.participants().Add("hotel"); ... };
//   EXPECT_EQ(t::CheckCrashes(MakeTripSaga, input, check).differences.size(), 0U);
//   EXPECT_TRUE(t::CheckDeterministic(MakeTripSaga, input, check).empty());
//
// Link idemsaga::testing. Not thread-safe across calls of one Environment (one Run at a time);
// the fakes are safe for a run's parallel branches.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "idemsaga/saga.hpp"

namespace idemsaga::testing {

namespace detail {
struct World;  // what one environment's participants, journal and clock share
}  // namespace detail

// What a fake participant answers one call.
struct Reply {
  enum class Kind { kSuccess, kRefusal, kRetryable, kInDoubt, kBlocked };
  Kind kind = Kind::kSuccess;
  nlohmann::json output;                     // kSuccess
  int status = 0;                            // kRefusal, kRetryable, kBlocked
  std::string code;                          // kRefusal
  std::string detail;                        // anything but kSuccess
  std::chrono::milliseconds retry_after{0};  // kRetryable: the participant's Retry-After
  // kInDoubt: the participant applied the request, and its answer was lost on the way back
  // (a later call of the key is replayed the default success).
  bool applied = false;
  // Virtual time the call takes. Past the step's call_timeout (StepPolicy::call_timeout) the
  // caller gives up: the participant still applies it, and the step is in doubt.
  std::chrono::milliseconds delay{0};

  // 2xx with `output` (kept, replayed to later calls of the key); null: the participant's
  // default output.
  static Reply Success(nlohmann::json output = nullptr);
  // A business refusal (4xx with an error code): terminal, the saga compensates. Replayed.
  static Reply Refusal(int status, std::string code, std::string detail = "");
  // Certainly not applied (a 5xx, a 429): the engine retries, after `retry_after` at least.
  static Reply Retryable(std::chrono::milliseconds retry_after = std::chrono::milliseconds(0),
                         int status = 503);
  // Sent and no answer came: it may have been applied (`applied` says whether it was).
  static Reply InDoubt(bool applied = false);
  // Not a business answer (a wrong token, a protocol error): the saga is stuck.
  static Reply Blocked(int status = 401, std::string detail = "unauthorized");
  // This reply, after `delay` of virtual time.
  Reply After(std::chrono::milliseconds delay) const;
};

enum class CallKind { kAction, kCompensation };

// One call a step made to a fake participant.
struct Call {
  std::string participant;
  std::string path;
  std::string step;         // the calling step's name
  std::string derived_key;  // "A-hotel", or "A-hotel-compensate"
  nlohmann::json body;      // a compensation's: {"action_key", "action_applied"}
  int attempt = 0;          // the engine's attempt number (StepContext::attempt)
  CallKind kind = CallKind::kAction;
  idemsaga::Outcome answer = idemsaga::Outcome::kSucceeded;  // what the step got back
  bool replayed = false;            // answered from the stored answer of its key
  std::chrono::milliseconds at{0};  // virtual time since the environment started
};

// One participant: a scripted, guarded double. Thread-safe.
class FakeParticipant : public ParticipantClient {
 public:
  ~FakeParticipant() override;
  // Replies for `derived_key`, call by call; the last one repeats. Replaces an earlier script.
  FakeParticipant& Script(const std::string& derived_key, std::vector<Reply> replies);
  // The output of an unscripted key's success (default {"<name>_id": "<derived key>"}).
  FakeParticipant& DefaultOutput(nlohmann::json output);
  // Without an idempotency guard: every call is applied anew and nothing is replayed (what a
  // crash check catches as a key applied twice).
  FakeParticipant& Unguarded();

  // How many times each derived key was applied (a replay applies nothing).
  std::map<std::string, int> Applied() const;
  const std::string& name() const;

  StepResult Post(const std::string& path, const StepContext& ctx,
                  const nlohmann::json& body) override;
  StepResult Compensate(const std::string& path, const StepContext& ctx) override;

 private:
  friend class FakeParticipants;
  struct Impl;
  explicit FakeParticipant(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The participants a definition is built over. Get throws std::out_of_range for a name not
// added, as the product's does for one not configured.
class FakeParticipants : public Participants {
 public:
  FakeParticipants();
  ~FakeParticipants() override;
  FakeParticipants(const FakeParticipants&) = delete;
  FakeParticipants& operator=(const FakeParticipants&) = delete;

  // The participant `name`, added on the first call (before the definition is built, and not
  // during a run). It lives as long as this object.
  FakeParticipant& Add(const std::string& name);
  ParticipantClient& Get(const std::string& name) const override;
  bool Has(const std::string& name) const override;
  // Every call so far, in the order made, across participants.
  std::vector<Call> Calls() const;
  // Each participant's applied keys: "<participant> <derived key>" -> times applied.
  std::map<std::string, int> Effects() const;

 private:
  friend class Environment;
  std::shared_ptr<detail::World> shared_;
  std::map<std::string, std::unique_ptr<FakeParticipant>> participants_;
};

// The engine's retry policy for a run (the product's defaults, see the README's "Retries").
struct Policy {
  int max_attempts = 1000;
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  std::chrono::milliseconds step_deadline{120000};
  int compensation_stuck_after = 8;
  std::chrono::milliseconds stuck_retry_interval{5000};
  std::chrono::milliseconds park_after{1000};  // 0: never park (waits are slept, virtually)
};

struct RunOptions {
  std::string key = "A";  // the parent Idempotency-Key: steps' keys are "A-<step>"
  std::string tenant = "demo";
  std::string order_id = "order-1";  // in the default answer
  std::string trace_id = std::string(32, 'a');
  Policy policy;
  // Times a stuck (deferred) saga is resumed, stuck_retry_interval apart, before Run reports
  // it stuck.
  int stuck_retries = 3;
  // Where the virtual clock starts (Unix ms; default 2030-01-01T00:00:00Z).
  long long start_unix_ms = 1893456000000LL;
};

enum class End {
  kCompleted,  // every step succeeded
  kFailed,     // a step failed for good and the applied steps were compensated
  kStuck,      // still stuck after RunOptions::stuck_retries resumes (blocked, a compensation
               // that keeps failing, an answer that does not compute)
};
const char* ToString(End end);

// One step as the saga recorded it.
struct StepRecord {
  std::string name;
  std::string status;  // not_run, succeeded, failed, in_doubt, compensated, waiting, skipped...
  int attempts = 0;
  int compensation_attempts = 0;
  nlohmann::json output;
  std::string detail;
};

struct Result {
  End end = End::kStuck;
  // The answer the orchestrator would store and replay: 201 (or the definition's Answer)
  // with its body, or the failing step's 4xx, or 502 <step>_unavailable, as a problem body.
  // A stuck run: 202 {"status", "stuck": true, ...}.
  int status = 0;
  nlohmann::json body;
  std::optional<SuccessAnswer> answer;  // completed, when the definition declares Answer
  std::string failed_step;              // failed (or stuck compensating)
  StepResult failure;                   // failed: the answer that decided it
  std::string stuck_detail;             // stuck: why
  std::vector<StepRecord> steps;
  nlohmann::json outputs = nlohmann::json::object();  // step name -> output
  std::vector<Call> calls;                            // made during this Run, in order
  std::vector<std::string> compensated;               // step names, in the order undone
  std::map<std::string, int> effects;                 // FakeParticipants::Effects() at the end
  std::chrono::milliseconds elapsed{0};               // virtual time the run took
  int runs = 0;  // how many times the engine ran it (a park, a deferral, a crash resume it)

  const StepRecord* Step(const std::string& name) const;  // nullptr when none
  // The calls under `derived_key`, in order.
  std::vector<Call> CallsOf(const std::string& derived_key) const;
  std::vector<std::string> CallKeys() const;  // every call's derived key, in order
};

// One saga's world: participants, the clock, the journal, events. One run at a time.
class Environment {
 public:
  explicit Environment(RunOptions options = {});
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  FakeParticipants& participants();
  // Delivers `event` to the run as POST /v1/runs/{saga}/{key}/events/{event} does: kept for
  // the Await step that takes it (before the run, or from a step while it runs). The first of
  // a name wins. Not validated here (EventWait::validate is the route's).
  void Send(const std::string& event, nlohmann::json payload = nlohmann::json::object());
  // The same, once `after` of virtual time has passed since the environment started.
  void SendAfter(std::chrono::milliseconds after, const std::string& event,
                 nlohmann::json payload = nlohmann::json::object());
  // Runs `definition` (built over participants()) on `input`, the request body, to its end:
  // completed, failed, or stuck. Throws InvalidInput when the input does not parse (the route
  // would answer 400). A second Run is a new saga under the same key: the participants keep
  // their effects and replay their stored answers to it.
  Result Run(const Definition& definition, const nlohmann::json& input);

  std::chrono::system_clock::time_point Now() const;  // the virtual clock
  std::chrono::milliseconds Elapsed() const;          // since the environment started

 private:
  friend struct CheckAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CheckOptions {
  RunOptions run;
  // Scripts the participants and sends events, before the definition is built, for every run
  // a check makes (each in a fresh environment).
  std::function<void(Environment&)> setup;
};

// One run of `factory`'s saga in a fresh environment (setup first). Throws
// std::invalid_argument when the factory serves no saga.
Result Run(const SagaFactory& factory, const nlohmann::json& input,
           const CheckOptions& options = {});

struct CrashDifference {
  int point = 0;      // 1-based, in the reference run's order
  std::string where;  // "at a step boundary after A-hotel", "in A-hotel, applied, answer lost"
  std::string difference;
};

struct CrashReport {
  Result reference;                          // the run without a crash
  int points = 0;                            // crash points tried
  std::vector<CrashDifference> differences;  // empty: every crash ended as the reference did
};

// Runs the saga once for reference, then once per crash point, killed there (the journal keeps
// what it had persisted, the participants their effects and stored answers) and resumed as a
// new owner, to its end. A difference: another end, answer (status, body), compensations,
// steps' statuses, or participants' effects (and any key applied more than once).
CrashReport CheckCrashes(const SagaFactory& factory, const nlohmann::json& input,
                         const CheckOptions& options = {});

struct BodyDifference {
  std::string step;
  std::string participant;
  std::string derived_key;
  std::string first, second;  // the bodies as sent (JSON text); "" when not sent in that run
};

// Runs the saga twice in fresh environments and compares, key by key, the body each request
// was first sent with, byte for byte. Every step is re-sent after a crash, and a body that
// changes (a timestamp, a fresh id, a counter) is refused 422 and leaves the saga stuck.
std::vector<BodyDifference> CheckDeterministic(const SagaFactory& factory,
                                               const nlohmann::json& input,
                                               const CheckOptions& options = {});

}  // namespace idemsaga::testing
