// The parent-key store: one row per (tenant, Idempotency-Key) in the orchestrator's database.
//
// Each method is one atomic phase, one short transaction, and never spans a network call.
// Every write by a running saga's owner is conditional on (lease_owner, lease_epoch): a process
// that lost its lease (paused, partitioned, too slow) writes nothing, and the write reports it
// as fenced. Times (lease expiry) come from the database clock.
// Thread-safe (the pool hands each call its own connection).
//   Claim claim = store.ClaimKey({tenant, key, hash, body, "place_order", 1, owner, trace_id});
//   if (claim.kind == Claim::kClaimed) { ...run...; store.Finish(claim.lease, true, 201, body,
//   steps); }
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/pg/pool.hpp"
#include "orchestrator/store/saga_status.hpp"
#include "orchestrator/store/span_rides.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator::store {

// The identity a saga's owner writes under.
struct Lease {
  std::string tenant_id;
  std::string key;
  std::string owner;
  long long epoch = 0;
};

// A step record as stored that this build cannot read, and why.
struct UnreadableStep {
  nlohmann::json stored;
  std::string why;
};

struct SagaRow {
  std::string tenant_id;
  std::string key;
  std::string request_hash;
  nlohmann::json request_body;
  std::string saga_name;
  int saga_version = 1;
  std::string order_id;
  SagaStatus status = SagaStatus::kStarted;
  std::string lease_owner;
  long long lease_epoch = 0;
  bool lease_live = false;  // lease_expires_at > now() (database clock)
  double lease_seconds_left = 0;
  // The step records, read once where the row is read. A record this build cannot read (a
  // newer build's status, a damaged row) is not guessed at: it is kept as stored under its
  // index in `unreadable_steps`, with a default record in its place here, so the row stays
  // visible (shown as it is), is written back unchanged (StepsColumn) and is never resumed.
  std::vector<steps::saga::StepRecord> steps;
  std::map<size_t, UnreadableStep> unreadable_steps;
  std::string failed_step;
  // The step answer that decided to compensate; nullopt until then.
  std::optional<steps::saga::StepResult> failure;
  // Why the stored failure could not be read ("" when it could). Like an unreadable step, it
  // keeps the row readable (listed, shown) but never resumed or resolved.
  std::string unreadable_failure;
  bool stuck = false;
  int response_status = 0;
  nlohmann::json response_headers;
  std::string response_body;
  std::string trace_id;
  std::string created_at;
  std::string updated_at;
  std::string root_span_id;       // the order request's span
  double expires_in_seconds = 0;  // until garbage collection may delete the row
  // Operators' decisions ({"operator","reason"|"note","at"}), null when none.
  nlohmann::json cancel_requested;
  nlohmann::json resolution;
  // While parked on a wait for external events: their names.
  std::vector<std::string> waiting_for;

  // Why this row cannot be resumed or resolved by this build: its first unreadable step
  // record or its unreadable failure; nullopt when every part of it was read.
  std::optional<std::string> UnreadableWhy() const {
    if (!unreadable_steps.empty()) return unreadable_steps.begin()->second.why;
    if (!unreadable_failure.empty()) return unreadable_failure;
    return std::nullopt;
  }
};

// `row`'s steps as the column holds them: each record's JSON, an unreadable one as it was
// stored.
nlohmann::json StepsColumn(const SagaRow& row);
// A steps column (as StepsColumn writes it, or a child saga's records in its output) read.
struct ReadRecords {
  std::vector<steps::saga::StepRecord> steps;
  std::map<size_t, UnreadableStep> unreadable;  // as SagaRow's unreadable_steps
};
ReadRecords ReadSteps(const nlohmann::json& column);

// A PostgreSQL text[] literal of names made of [a-z0-9_] (they need no quoting).
std::string TextArray(const std::vector<std::string>& names);

// What a garbage-collection batch deleted: how many keys, and the traces they named.
struct ExpiredKeys {
  long long keys = 0;
  std::vector<std::string> trace_ids;  // distinct
};

// A request under a parent key: what the key is claimed for, and what a retry must match.
struct ClaimRequest {
  std::string tenant_id;
  std::string key;
  std::string request_hash;  // common::RequestFingerprint
  nlohmann::json request_body;
  std::string saga_name;
  int saga_version = 1;
  std::string owner;
  std::string trace_id;
  std::string root_span_id;
  bool Matches(const std::string& stored_hash) const { return stored_hash == request_hash; }
};

struct Claim {
  enum Kind {
    kClaimed,     // new key: this request owns the saga (lease set)
    kTakenOver,   // the previous owner's lease had expired: this request resumes the saga
    kFinished,    // completed/failed: replay `row`'s stored response
    kInProgress,  // another owner holds a live lease
    kMismatch,    // the key was used with another request
  };
  Kind kind;
  SagaRow row;
  Lease lease;  // kClaimed, kTakenOver
  // When the lease was (re)set, by this process's clock: its renewal schedule starts here.
  std::chrono::steady_clock::time_point leased_at = std::chrono::steady_clock::now();
};

struct StoreOptions {
  std::chrono::seconds lease{30};  // how long an owner may go without renewing
  // Finished keys are kept this long after they finish.
  std::chrono::seconds retention{std::chrono::hours(24)};
};

class ParentStore {
 public:
  // With `rides`, each finish also stores the span rows waiting there (span_rides.hpp).
  ParentStore(common::pg::Pool& pool, StoreOptions options, SpanRides* rides = nullptr)
      : pool_(pool), options_(options), rides_(rides) {}
  virtual ~ParentStore() = default;

  Claim ClaimKey(const ClaimRequest& req);

  // Takes over a running saga whose lease has expired (recovery). nullopt if it is not
  // expired or no longer running.
  std::optional<Claim> TakeOverExpired(const std::string& tenant_id, const std::string& key,
                                       const std::string& owner);

  // Extends the lease; false when fenced. `cancel_requested` (if given) is set to whether an
  // operator has asked to cancel the saga.
  bool Renew(const Lease& lease, bool* cancel_requested = nullptr);
  // Commits the decision to compensate; false when fenced.
  bool BeginCompensation(const Lease& lease, const nlohmann::json& steps,
                         const std::string& failed_step, const nlohmann::json& failure);
  // Marks a saga stuck and lets its lease expire after `retry_in` (recovery retries it then).
  bool DeferStuck(const Lease& lease, const nlohmann::json& steps,
                  std::chrono::milliseconds retry_in);
  // Checkpoints a waiting saga's steps and lets its lease run out after `wake_in` (not
  // stuck): recovery in any replica resumes it then. False when fenced.
  bool Park(const Lease& lease, const nlohmann::json& steps, std::chrono::milliseconds wake_in);
  // Parks the same way, and lets a delivery of any of `events` (EventStore::Deliver) wake it
  // sooner. kArrived: one had been delivered meanwhile; the lease is still this owner's,
  // renewed, and the saga goes on here.
  enum class AwaitOutcome { kParked, kFenced, kArrived };
  AwaitOutcome ParkForEvents(const Lease& lease, const nlohmann::json& steps,
                             const std::vector<std::string>& events,
                             std::chrono::milliseconds wake_in);
  // Stores the final response and ends the lease; false when fenced.
  // `response_headers` are stored with the answer and replayed with it.
  bool Finish(const Lease& lease, bool completed, int response_status,
              const std::string& response_body, const nlohmann::json& steps,
              const std::map<std::string, std::string>& response_headers = {
                  {"Content-Type", "application/json"}});

  std::optional<SagaRow> Get(const std::string& tenant_id, const std::string& key);

  // Recovery: takes over up to `limit` running sagas whose lease expired, oldest first.
  // FOR UPDATE SKIP LOCKED: concurrent sweepers in other replicas claim disjoint sagas.
  std::vector<Claim> TakeOverExpiredBatch(const std::string& owner, int limit);
  // Shutdown: lets every lease `owner` holds expire now, so another replica resumes at once.
  long long ReleaseLeases(const std::string& owner);
  // Admin: a stuck saga's lease expires now, so recovery retries it at once. False if the
  // key is not a running saga of this tenant.
  bool RetryNow(const std::string& tenant_id, const std::string& key);
  // Admin: records `request` ({"operator","reason"}, and "at" from the database clock) on a saga
  // that is still running its actions (`started`); its owner stops at the next step boundary and
  // compensates. False for any other state (the caller reads the row to say which).
  bool RequestCancel(const std::string& tenant_id, const std::string& key,
                     const nlohmann::json& request);
  // Admin: records `resolution` and `steps` (the stuck step now compensated by hand) on a
  // stuck compensation and lets its lease expire, so recovery goes on with the rest. False
  // unless the saga is compensating and stuck (deferred: nobody is undoing it right now).
  bool Resolve(const std::string& tenant_id, const std::string& key,
               const nlohmann::json& resolution, const nlohmann::json& steps);
  // Reconciliation: every tenant, and a tenant's sagas created in the last `since`, `limit`
  // at a time in key order after `after`.
  std::vector<std::string> TenantIds();
  std::vector<SagaRow> CreatedSince(const std::string& tenant_id, std::chrono::seconds since,
                                    const std::string& after, int limit);
  // Admin: a tenant's sagas, newest first, `limit` at most; `status` nullopt and `saga` ""
  // for all, `stuck_only` to filter.
  std::vector<SagaRow> List(const std::string& tenant_id, std::optional<SagaStatus> status,
                            bool stuck_only, int limit, const std::string& saga = "");
  // Garbage collection: deletes up to `batch` finished keys past their retention. Their
  // traces' spans are the caller's to delete next (SpanStore::DeleteForTraces); a crash in
  // between leaves them to SpanStore::DeleteUnowned.
  ExpiredKeys DeleteExpired(int batch);

  struct Counts {
    long long running = 0;
    long long stuck = 0;
  };
  Counts CountRunning();

  // The tenant whose API key hashes to `api_key_hash`, if any.
  std::optional<std::string> TenantForKeyHash(const std::string& api_key_hash);
  // Creates or re-keys a tenant.
  void UpsertTenant(const std::string& tenant_id, const std::string& api_key_hash);

  // Writes refused because the writer had lost its lease (for metrics and tests).
  long long fenced_writes() const { return fenced_writes_; }

  const StoreOptions& options() const { return options_; }

 protected:
  // A seam for tests (a race made to happen): runs when a claim found the key taken, before
  // it reads the key. Does nothing here.
  virtual void OnClaimConflict() {}

 private:
  bool Fenced(const Lease& lease, const char* what, bool applied);
  // DeferStuck and Park: the steps checkpointed, the lease left to run out after `until`.
  bool SetAside(const Lease& lease, const nlohmann::json& steps, std::chrono::milliseconds until,
                bool stuck, const std::vector<std::string>& waiting_for, const char* what);
  // Runs `fn(tx)` on a borrowed connection: each phase here is one statement, committed on its
  // own (autocommit), so it needs no BEGIN and COMMIT round trips. A broken connection is
  // discarded (Pool::With).
  template <typename Fn>
  auto OneStatement(Fn&& fn) {
    return pool_.With([&](pqxx::connection& conn) {
      pqxx::nontransaction tx(conn);
      return fn(tx);
    });
  }

  common::pg::Pool& pool_;
  StoreOptions options_;
  SpanRides* rides_;
  std::atomic<long long> fenced_writes_{0};
};

}  // namespace idemsaga::orchestrator::store
