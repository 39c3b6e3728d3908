// The participant-side idempotency guard: makes any endpoint's effect happen at most once per
// (tenant, key), and answers every retry with the first answer, byte for byte.
//
// The claim, the business effect and the stored response commit in one transaction, so a
// crash or a transient error leaves nothing behind and the retry simply runs again. A
// concurrent duplicate blocks on the key's unique index until the first commits, then replays.
// An effect that acts only through its transaction may instead run before the key is written
// (EffectScope::kTransactionOnly): the key's row is then written once, not claimed and updated.
// Business failures (a 4xx the effect returns) are stored and replayed like successes; an
// effect that answers non-2xx must therefore change nothing.
//
// Effects outside the database (a card network, an e-mail provider) use RunExternal: the key is
// claimed as pending with a lease and a fencing token in one short transaction, the call goes
// out with no transaction open, and a second transaction records the answer only if the
// token is still the caller's. A duplicate meanwhile gets 409; a claim whose lease expired
// (its process died mid-call) is taken over by the next request with the key, under the next
// token, and its effect is told that an earlier attempt may have reached the third party.
//
// Compensations name the action key they undo. If the action is there, it is undone once
// (however often the compensation is retried, under whichever key). If it never arrived, a
// tombstone is stored under the action key so a late action is refused (409 `cancelled`).
//
// Thread-safe; one Guard per participant database.
//   guard::Guard g(pool);
//   auto res = g.Run(req, [&](pqxx::work& tx) { return Reserve(tx, items); });
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/pg/pool.hpp"
#include "common/trace/span.hpp"
#include "steps/protocol/participant_protocol.hpp"

namespace idemsaga::steps::guard {

struct Request {
  std::string tenant_id;
  std::string key;
  std::string method;
  std::string path;
  nlohmann::json body;               // parsed and validated at the route
  common::trace::SpanContext trace;  // the request's span: parent of the guard's spans
};

// The guard's answer: an HTTP answer (common::http::Answer's fields) plus what the guard did
// with the key (`replayed`, `outcome`), which its route, spans and metrics read. Not an alias:
// those two belong to the guard, not to HTTP.
struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  bool replayed = false;  // answered from the stored response; send Idempotent-Replayed: true
  // An action's applied | replayed | reused | cancelled (tombstone) | compensated |
  // in_progress | action_unknown | fenced, or a compensation's undone | already_undone |
  // nothing_to_undo | cancelled (tombstone written) | replayed: for spans, logs and metrics.
  // ToString(outcome) is its name (steps/protocol/participant_protocol.hpp).
  protocol::Outcome outcome = protocol::Outcome::kNone;
  // Further headers of the answer (Location, any the handler names): stored and replayed.
  std::map<std::string, std::string> headers;
};

// A refusal as a problem (application/problem+json): a business answer such as 402
// card_declined, stored and replayed like any other. Built by common::http::ProblemAnswer.
Response Problem(int status, const std::string& code, const std::string& detail);

// A problem the guard answers of its own (kRefusals in participant_protocol.hpp): its status,
// code and detail, its outcome, and `Retry-After` when it asks the caller to come back (the
// one rule, common::http::CarriesRetryAfter). The one way a guard, or a store of its own,
// builds one.
Response Refuse(protocol::Refusal refusal);

// The stored answer of the action a compensation undoes. status 0 (body null): its outcome is
// unknown, an external call cut off mid-way (CompensateExternal): undo it by its key at the
// third party, or look it up first.
struct ActionRecord {
  std::string key;
  int status = 0;
  nlohmann::json body;
};

// common::RequestFingerprint of the request.
std::string Fingerprint(const Request& req);

// The statuses it answers itself (kKeyReusedStatus, kInProgressStatus, kCompensatedStatus,
// kActionUnknownStatus), kPolicyPath, kKeysPath and KeyRecord: participant_protocol.hpp.

// What a request does when a duplicate of it (same tenant and key) is in flight.
enum class Duplicates {
  // Waits on the key's unique index until the first commits (bounded by the session's
  // lock_timeout), then replays its answer: the duplicate holds a connection and a worker
  // meanwhile.
  kWait,
  // Tries a transaction-scoped advisory lock on (tenant, key) first and, when another request
  // holds it, answers 409 idempotency_key_in_progress + Retry-After at once, before any effect
  // runs. Costs one statement per request. Transaction-scoped only: libpqxx 6.4 reconnects
  // silently, which would drop a session lock without a word.
  kFailFast,
};

struct GuardOptions {
  // How long a RunExternal claim is held before another request may take it over: longer than
  // the external call can take (its timeouts), or two calls may overlap.
  std::chrono::seconds lease{30};
  // How long a key (and so its replay, its tombstone, its "compensated") is kept, counted from
  // the claim, or from the compensation that undid it. It must exceed the orchestrator's
  // retention plus its longest saga (the orchestrator checks at start-up): a step retried by a
  // resumed saga, or a compensation, must always find its key.
  std::chrono::seconds retention{std::chrono::hours(24 * 7)};
  Duplicates duplicates = Duplicates::kWait;
};

// "wait" or "fail-fast" (flags); nullopt for anything else.
std::optional<Duplicates> ParseDuplicates(std::string_view name);

// Thrown by an external effect when its call certainly did not reach the third party (the
// connection was refused): the claim is released at once and a retry may call again. Any
// other exception means it may have happened: the claim is kept until its lease runs out.
struct NotSent : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What an external effect (RunExternal, CompensateExternal) is given.
struct ExternalCall {
  const Request& request;
  // Grows with each takeover of the key. A third party that can fence (a conditional write)
  // should be given it: a late call under an older token is then refused there too.
  long long fencing_token = 0;
  // An earlier holder of this key's claim died (or failed) mid-call: the third party may
  // already have done it. Pass the same key downstream, or look the effect up first.
  bool earlier_attempt = false;
  // When the call must be over (a quarter of the lease before it ends): set the third party's
  // client timeouts to end by then. A call that outlives the lease may be taken over while it
  // is still out, and two calls would then overlap.
  std::chrono::steady_clock::time_point deadline;
};

// An effect outside the database: called with no transaction open. It answers a 2xx or a 4xx
// to store and replay; a 5xx or an exception stores nothing (503): the claim is kept until its
// lease runs out (NotSent releases it at once), and the retry that takes it over is told
// earlier_attempt.
using ExternalEffect = std::function<Response(const ExternalCall& call)>;
// Undoes an external action, with no transaction open; returns details for the answer.
using ExternalUndo =
    std::function<nlohmann::json(const ExternalCall& call, const ActionRecord& action)>;

// The guard's state machine for effects outside the store, kept in one store: claim or replay,
// the fingerprint (422 on reuse), 409 + Retry-After while a claim is live, the leased and
// fenced claim with `earlier_attempt` on takeover, the answer stored with its headers,
// compensations that undo once or leave a tombstone, `compensated`, `action_unknown`, and
// expiry counted from the last write. Guard (PostgreSQL) and RedisGuard keep it, and the
// conformance suite (tests/integration/participant_stores_itest.cpp) holds every store to the
// same answers, byte for byte. A participant picks one at start-up; HttpGuard serves any.
class KeyStore {
 public:
  virtual ~KeyStore() = default;
  // Calls `effect` at most once per (tenant, key) among live claims; stores and replays its
  // answer. Throws when the store is unreachable (nothing known to have happened: retry).
  virtual Response RunExternal(const Request& req, const ExternalEffect& effect) = 0;
  // Runs `undo` at most once for the action under (tenant, action_key), or leaves a tombstone
  // that refuses it; `action_applied`: a missing record is 409 action_unknown, stored nowhere.
  virtual Response CompensateExternal(const Request& req, const std::string& action_key,
                                      const ExternalUndo& undo, bool action_applied) = 0;
  // A tenant's keys written in the last `since`, `limit` at a time in key order after `after`.
  virtual std::vector<protocol::KeyRecord> ListKeys(const std::string& tenant_id,
                                                    std::chrono::seconds since,
                                                    const std::string& after, int limit) = 0;
  // Deletes up to `batch` keys past their expiry; 0 from a store that expires keys itself.
  virtual long long DeleteExpired(int batch) = 0;
  // True when the store answers.
  virtual bool Ready() = 0;
  virtual const GuardOptions& options() const = 0;
};

// What an effect may touch, which decides when the guard calls it.
enum class EffectScope {
  // Anything (a metric, a log line, a call out): the effect is called only once the key is
  // claimed, so at most once per key however many duplicates arrive.
  kAny,
  // Only the database, through `tx`. The effect is called first and the key with its answer is
  // INSERTed after it: one round trip and one row version fewer per request (the participant's
  // whole transaction is BEGIN, the effect, one INSERT, COMMIT). When the key is taken (a
  // retry, a duplicate, a tombstone) the INSERT finds it, or the effect trips on a unique index
  // of its own; the transaction rolls back whole and the request is answered as under kAny. So
  // the effect may be called, and rolled back, more than once.
  kTransactionOnly,
};

// A business effect that is one data-modifying SQL statement whose answer is known before it
// runs (its ids made by the caller): Guard::RunPlanned commits the key, the answer and the
// effect in one statement, one round trip (no BEGIN, no COMMIT). `sql` reads the CTE `claimed`,
// which has one row when this request claimed the key and none otherwise, so that the effect
// happens only with the claim:
//   PlannedEffect charge{{201, body},
//                        "INSERT INTO charges (charge_id, amount) SELECT $1, $2 FROM claimed",
//                        {id, "2500"}};
// Empty `sql`: nothing to apply, only the answer to store (a business refusal). Parameters are
// text, as PostgreSQL's input functions read them: exactly as many as `sql` uses, at most 64.
// A plan that passes another number, or that does not read `claimed`, is refused
// (std::invalid_argument) before anything runs.
//
// An effect that may find nothing to do where the plan looks (no stock in the slot it
// tries, say) sets `otherwise`: `sql` then has a RETURNING clause and returns a row whenever
// the plan changed anything (a row changed in `ctes` that `sql` does not return would commit
// without its key); the key and `answer` are stored only then. Otherwise nothing is stored:
// a key found taken is answered from the key by Run(kAny) with `otherwise` as its effect
// (called only for a key this request then owns), and a plan that found nothing to do by
// Run(kTransactionOnly) with `otherwise`, which decides for itself and, like any
// transaction-only effect, may be called and rolled back. With `otherwise` and no `sql`,
// RunPlanned is Run(kAny) with `otherwise`: a request the plan cannot express.
//
// An effect of several statements names the ones before `sql` in `ctes`, which go after
// `claimed` at the top of the statement (where PostgreSQL wants data-modifying CTEs):
//   ctes = "taken AS (UPDATE stock SET ... WHERE EXISTS (SELECT 1 FROM claimed) RETURNING n)",
//   sql = "INSERT INTO reservations ... SELECT ... FROM taken RETURNING 1".
// The rules on parameters hold for `ctes` and `sql` together, and one of them must read
// `claimed`: gate every statement that changes rows on it (the check cannot see which do).
struct PlannedEffect {
  Response answer;
  std::string sql;
  std::vector<std::string> params;
  std::function<Response(pqxx::work& tx)> otherwise;
  std::string ctes;
};

// The key store in PostgreSQL, which also guards effects inside the participant's own database
// (Run, RunPlanned, Compensate): the key and the effect commit in one transaction.
class Guard : public KeyStore {
 public:
  using Effect = std::function<Response(pqxx::work& tx)>;
  // Undoes a successful action inside `tx`; returns details for the compensation's answer.
  using Undo = std::function<nlohmann::json(pqxx::work& tx, const ActionRecord& action)>;
  using ExternalEffect = guard::ExternalEffect;
  using ExternalUndo = guard::ExternalUndo;

  // `tracer` may be null (no spans).
  explicit Guard(common::pg::Pool& pool, const common::trace::Tracer* tracer = nullptr,
                 GuardOptions options = {})
      : pool_(pool), tracer_(tracer), options_(options) {}

  // Commits `effect` at most once for (tenant, key). Throws on transient failure (database
  // unavailable or broken mid-way): nothing is stored and a retry with the key runs again.
  Response Run(const Request& req, const Effect& effect, EffectScope scope = EffectScope::kAny);
  // Run for an effect planned in advance: one statement when the key is new. When it is not
  // (a retry, a duplicate, a tombstone; or the effect's own unique index trips), nothing was
  // applied and the request is answered as Run(kTransactionOnly) answers it, with the same
  // plan as its effect (with `otherwise`, see PlannedEffect). Under Duplicates::kFailFast it
  // is that Run from the start (with `otherwise`: Run(kAny) with it).
  Response RunPlanned(const Request& req, const PlannedEffect& plan);

  // Runs `undo` at most once for the action under (tenant, action_key). The compensation's
  // own key makes the compensation itself replayable. Answers 200 with
  // {"action_key", "outcome": "undone" | "already_undone" | "nothing_to_undo" | "cancelled"}.
  // `action_applied`: the caller saw the action succeed, so a missing record is not "never
  // arrived" (a tombstone) but 409 `action_unknown`, stored nowhere.
  Response Compensate(const Request& req, const std::string& action_key, const Undo& undo,
                      bool action_applied = false);

  // Calls `effect` at most once per (tenant, key) among live claims (see the header comment),
  // and stores and replays its answer like Run's. Outcomes besides Run's: in_progress (a live
  // claim holds the key: 409), fenced (this caller's claim was taken over meanwhile: its
  // answer is not stored; the current holder's stored answer, or 409, is returned).
  Response RunExternal(const Request& req, const ExternalEffect& effect) override;
  // Compensate for an action whose undo is external: the compensation's own key is claimed as
  // RunExternal claims, `undo` runs with no transaction open, and the action is marked undone
  // with the answer, fenced by the token. An action still pending under a live lease answers
  // 409 (retry later); one whose lease ran out is cut off (refused from then on, its holder's
  // late answer fenced) and `undo` is given its record with status 0: outcome unknown.
  // `undo` runs at most once per compensation key; give the third party the action key so
  // that undoing twice under two compensation keys is harmless there.
  Response CompensateExternal(const Request& req, const std::string& action_key,
                              const ExternalUndo& undo, bool action_applied = false) override;

  // A tenant's keys written or compensated in the last `since` (at most the retention),
  // `limit` at a time in key order after `after`: what a reconciler compares with the sagas
  // that derived them. Reads the expiry index (a key's expiry moves with each write).
  std::vector<protocol::KeyRecord> ListKeys(const std::string& tenant_id,
                                            std::chrono::seconds since, const std::string& after,
                                            int limit) override;

  // Deletes up to `batch` keys past their expiry (GuardOptions::retention).
  long long DeleteExpired(int batch) override;
  bool Ready() override;

  const GuardOptions& options() const override { return options_; }

 private:
  template <typename Body>
  Response InTransaction(const Request& req, const Body& body);
  // The lease protocol of RunExternal and CompensateExternal: `claimed(tx, earlier)` runs in
  // the claim's transaction once the key is this caller's (it may answer at once: stored,
  // nothing called out); otherwise `call(token, earlier)` runs outside any transaction, and
  // `record(tx)` beside the fenced store of its answer.
  template <typename Claimed, typename Call, typename Record>
  Response External(const Request& req, const Claimed& claimed, const Call& call,
                    const Record& record);
  common::trace::Span StartSpan(const std::string& name, const Request& req) const;
  double RetentionSeconds() const;

  common::pg::Pool& pool_;
  const common::trace::Tracer* tracer_;
  GuardOptions options_;
};

}  // namespace idemsaga::steps::guard
