// Runs submitted sagas end to end: claims the parent key, drives the saga (the definition the
// key started with, from the registry) on a thread pool
// (Boost.Asio) with a store-backed, lease-fenced journal, stores the final response, and
// answers the request within the response budget (or says it is still running).
//
// Thread-safe. Shutdown() stops new work and lets running sagas stop at their next step
// boundary; their leases expire and recovery resumes them.
//   SagaService svc(store, events, registry, policy, {.owner = "host:1234"});
//   RunOutcome o = svc.Submit({registry.Latest("ship_order"), input, {tenant, key, hash, body}});
// The start of a run from outside goes through orchestrator/start_run.hpp, which parses and
// fingerprints the request first.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/deadline_watch.hpp"
#include "common/metrics.hpp"
#include "orchestrator/response.hpp"
#include "orchestrator/store/event_store.hpp"
#include "orchestrator/store/finished_cache.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "steps/saga/registry.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator {

// What the parent key said about a request.
enum class KeyOutcome {
  kNone,        // answered before the key was consulted (shutting down)
  kClaimed,     // a new key: this request started the saga
  kTakenOver,   // its owner had died: this request resumed the saga
  kReplayed,    // finished: the stored answer
  kInProgress,  // another owner runs it (409)
  kMismatch,    // the key was used with another request (422)
};
// "claimed", "taken_over", "replayed", "in_progress", "reused" ("" for kNone): the span
// attribute idempotency.outcome and the metric's label.
const char* ToString(KeyOutcome outcome);

// What became of a request to start a run: the "start a run" use case's typed answer, the
// same for every adapter (HTTP, AMQP, the in-process client). No wire format in it but a
// finished run's stored answer, which is the run's canonical representation: every adapter
// hands it on byte for byte. The rest (in progress, reused, still running, unavailable) each
// adapter renders its own way (orchestrator/http/run_answer.cpp for HTTP).
struct RunOutcome {
  enum class Kind {
    kFinished,     // ended now, completed or failed: `answer` is what it stored
    kReplayed,     // ended before: `answer` as stored (marked Idempotent-Replayed)
    kRunning,      // still running past the response budget, queued, parked or stuck
    kInProgress,   // another request runs it: ask again after `retry_after`
    kReused,       // the key was used with another request: nothing else happened
    kInvalid,      // the input is not what the saga takes (`detail`): nothing stored
    kUnknownSaga,  // no saga of that name is served here: nothing stored
    kUnavailable,  // shutting down or an outage (`detail`): a retry with the same key is safe
    kInternal,     // stopped by an internal error (`detail`): nothing final was stored
  };
  Kind kind = Kind::kUnavailable;
  common::http::Answer answer;  // kFinished, kReplayed
  std::string detail;           // kInvalid, kUnavailable, kInternal: what happened, in a sentence
  // kRunning: the run's state, and why it is not answering yet.
  store::SagaStatus status = store::SagaStatus::kStarted;
  bool waiting = false;        // parked on a timer or an event (`waiting_for`)
  bool stuck = false;          // set aside: a compensation keeps failing, or a config fault
  nlohmann::json waiting_for;  // the events it waits for, when it waits for any
  std::string order_id;        // kRunning, kFinished
  std::chrono::seconds retry_after{1};  // kInProgress: about when its lease runs out
  // For the request's span: what the key said, and the saga's trace (when there is one).
  KeyOutcome outcome = KeyOutcome::kNone;
  // The request's span (RunStarter::Start), for the adapter to hand back to its caller.
  std::string traceparent;
  // The request started or resumed the saga (its span is the saga's root).
  bool Owns() const { return outcome == KeyOutcome::kClaimed || outcome == KeyOutcome::kTakenOver; }
  // The run has its final answer (kFinished, kReplayed).
  bool Final() const { return kind == Kind::kFinished || kind == Kind::kReplayed; }
  std::string trace_id;
  std::string root_span_id;
  // Not the answer: it goes out later through Submission::answer_early, from the saga's
  // thread (or a kRunning at the response budget). The request's worker is free meanwhile.
  bool deferred = false;
};

struct Submission {
  const steps::saga::Definition* definition = nullptr;  // what the route starts (a registry entry)
  std::shared_ptr<const std::any> input;                // its typed input, parsed at the route
  // The key and the request; Submit fills in saga_name, saga_version (the definition's) and
  // owner (this process). root_span_id: the request's span, parent of the saga's.
  store::ClaimRequest request;
  // Sends an answer to the request from another thread, before or after Submit returns; false
  // when it was answered already. When set, a saga this request starts runs on the calling
  // thread (no hand-off to the pool and back) up to inline_limit, and a request still waiting
  // for it after the response budget gets its kRunning through this; past inline_limit the
  // saga runs on the pool and Submit returns a `deferred` outcome at once, the saga's answer
  // following through this. When unset, the saga runs on the pool and Submit waits for it.
  std::function<bool(const RunOutcome&)> answer_early;
  // The key's stored answer, already found in the finished-answer cache (CachedAnswer): Submit
  // replays it without looking again, so a replay answered on the event loop never reaches
  // the database.
  std::optional<store::FinishedAnswer> replay;
};

struct SagaServiceOptions {
  std::string owner;    // this process's lease identity
  size_t threads = 64;  // sagas resumed by recovery, and submissions without answer_early
  std::chrono::milliseconds response_budget{10000};  // then 202 and the saga goes on
  // Sagas run at most this many at once on the threads of the requests that started them
  // (Submission::answer_early), the rest on the pool. Below the server's workers (32): a
  // saga held up by a slow participant keeps its worker until it ends, and reads, polls of
  // the 202's Location and health checks must still find one.
  size_t inline_limit = 24;
  // Sagas of one tenant running at once in this process, at most (0: no limit): one tenant's
  // burst, or its sagas held up by a slow participant, cannot take every thread. A saga past
  // it waits durably (queued, its lease run out) and recovery starts it when a slot is free.
  size_t tenant_running_limit = 0;
  store::FinishedCache::Options finished_cache;  // replays of finished keys from memory
  // Told each boundary of a run (steps::saga::Runner::AtBoundary), and the service's own:
  // after_claim (a key claimed, nothing run) and after_finish (the answer stored, not yet sent).
  // Unset: none is reported. Only a fault-injection build sets it (cmd/idemsaga/crash_points.hpp).
  steps::saga::Runner::AtBoundary at_boundary;
};

// The saga POST /v1/orders runs; every registered saga runs under POST /v1/runs/{name}.
inline constexpr const char* kOrderSaga = "place_order";
// Where a saga's state is read: /v1/orders/{key} for orders, /v1/runs/{saga}/{key} otherwise
// (the key percent-encoded).
std::string StatusPath(const std::string& saga_name, const std::string& key);

class SagaService {
 public:
  // `tracer` may be null (no spans). Counts go to `metrics` (a registry of its own if null):
  //   idemsaga_idempotency_requests_total{outcome}: what the parent key said to a request
  //   idemsaga_saga_duration_seconds{saga,end}: one run of a saga in this process, to its end
  //   (completed, failed) or its stop (deferred, fenced, abandoned, interrupted)
  // and the runner's step attempts and compensations (steps::saga::RunnerMetrics).
  SagaService(store::ParentStore& store, store::EventStore& events,
              const steps::saga::Registry& registry, steps::saga::RetryPolicy policy,
              SagaServiceOptions options, const common::trace::Tracer* tracer = nullptr,
              common::metrics::Registry* metrics = nullptr);
  ~SagaService();

  RunOutcome Submit(const Submission& submission);
  // The stored answer of a finished key whose request matches `request_hash`, from memory
  // only (the finished-answer cache); nullopt otherwise. Never blocks. `sample` says whether
  // this replay is the one of its key's retry storm to trace (store::ReplaySample).
  std::optional<store::FinishedAnswer> CachedAnswer(const std::string& tenant_id,
                                                    const std::string& key,
                                                    const std::string& request_hash,
                                                    store::ReplaySample& sample);

  enum class CancelResult {
    kRequested,            // recorded; the saga stops at its next step boundary
    kAlreadyCompensating,  // it is being undone already
    kEnded,                // completed or failed: nothing to cancel
  };
  // Operator: asks the running saga `row` to stop at its next step boundary and compensate
  // what ran, wherever it runs (this process at once, another replica at its next lease
  // renewal, a stuck one when recovery resumes it).
  CancelResult Cancel(const store::SagaRow& row, const std::string& operator_name,
                      const std::string& reason);
  // Operator: records that the stuck compensation of `row` (the step it keeps failing on)
  // was done by hand, says `note`, and lets the saga go on at once: it compensates the steps
  // before that one and ends `failed` with the answer any failure of it gets. Returns the
  // step; nullopt unless `row` is compensating and stuck (and still is when written).
  std::optional<std::string> Resolve(const store::SagaRow& row, const std::string& operator_name,
                                     const std::string& note);

  // Drives a saga this process has just taken over (recovery) on the pool. False when
  // shutting down (the lease then simply expires again).
  bool ResumeAsync(const store::Claim& claim);
  // How many more sagas the pool can start right now without queueing (recovery claims no
  // more than this, so a claimed lease never waits in a queue).
  int FreeCapacity() const;

  // Stops taking new sagas; running ones stop at their next step boundary.
  void Shutdown();
  long long running() const { return running_; }
  long long resumed() const { return resumed_; }
  const std::string& owner() const { return options_.owner; }

 private:
  // `input`: the typed input when the route parsed it (a new claim); null when resumed.
  // `answer_by`: the request that runs it on its own thread waits until then (SagaInput).
  RunOutcome Drive(const store::Claim& claim, std::shared_ptr<const std::any> input,
                   std::chrono::steady_clock::time_point answer_by = {});
  RunOutcome Replay(const store::SagaRow& row);
  // Remembers a finished row's answer for replays; returns it.
  store::FinishedAnswer Remember(const store::SagaRow& row, int status, const std::string& body,
                                 std::map<std::string, std::string> headers,
                                 std::chrono::milliseconds row_expires_in);
  // The answer for what the key said; starts the saga when this request owns it.
  RunOutcome AnswerClaim(const store::Claim& claim, const Submission& s);

  RunOutcome Counted(RunOutcome o);

  // Takes one off a count when the scope ends, however it ends.
  struct CountDown {
    std::atomic<long long>& n;
    ~CountDown() { --n; }
  };

  // Backoff sleeps wake at once on shutdown.
  void SleepUnlessStopping(std::chrono::milliseconds d);

  store::ParentStore& store_;
  store::EventStore& events_;
  SagaServiceOptions options_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  std::atomic<long long> running_{0};
  std::atomic<long long> running_inline_{0};  // of running_: on their request's thread
  std::atomic<long long> resumed_{0};
  steps::saga::RetryPolicy policy_;
  const steps::saga::Registry& registry_;
  const common::trace::Tracer* tracer_;
  store::FinishedCache finished_;
  // The cancel flag of every saga running in this process, by tenant + '\n' + key.
  std::mutex cancels_mutex_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> cancels_;
  // Running sagas by tenant (SagaServiceOptions::tenant_running_limit); guarded by
  // cancels_mutex_. A slot is taken before a saga is driven, and given back by Drive.
  std::map<std::string, size_t, std::less<>> tenant_running_;
  bool TakeTenantSlot(const std::string& tenant);
  void GiveTenantSlot(const std::string& tenant);
  // Sets a claimed saga aside for recovery to start after `wake_in`: false when fenced.
  bool Queue(const store::Claim& claim, std::chrono::milliseconds wake_in, const char* reason);
  common::metrics::Registry own_metrics_;
  common::metrics::Registry& metrics_;
  steps::saga::RunnerMetrics runner_metrics_;
  common::metrics::Family<common::metrics::Counter>& key_outcomes_;
  common::metrics::Family<common::metrics::Histogram>& durations_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
  // Sends the 202 of a request whose saga outlives the response budget on its thread.
  common::DeadlineWatch budget_watch_{std::chrono::milliseconds(50)};
};

}  // namespace idemsaga::orchestrator
