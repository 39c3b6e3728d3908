// The guard on an HTTP route: one call makes a cpp-httplib handler (for httplib::Server or
// common::http::Server) that does everything around a guarded effect. For each request it
// checks the caller's bearer service token (401), reads X-Tenant-ID (401; with a placement,
// 503 for a tenant this cluster does not serve now), the
// Idempotency-Key (an RFC 8941 sf-string or a bare token; 400) and the JSON body (400/413/415),
// asks `validate` (400 naming the field), runs the effect under the Guard (claim or replay,
// 422 on reuse, 409 + Retry-After while a duplicate runs), and answers: a replay is the first
// answer byte for byte, with `Idempotent-Replayed: true`. A database outage is a 503 that is
// safe to retry with the same key. Nothing is stored for any refusal.
//
// Thread-safe; the guard, the tracer and the hooks must outlive the handlers.
//   steps::guard::HttpGuard http(guard, {.service_token = token});
//   server.Post("/v1/bookings", http.Action(ValidateBooking, Book));
//   server.Post("/v1/bookings/cancel", http.Compensation(CancelBooking));
//   server.Post("/v1/emails", http.ExternalAction(ValidateEmail, SendThroughProvider));
//
// A store of the caller's own (the inventory on Redis) keeps the same edge: construct it
// without a Guard and wrap the store's call with Guarded() / GuardedCompensation().
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/metrics.hpp"
#include "common/pg/placement.hpp"
#include "common/trace/span.hpp"
#include "steps/guard/guard.hpp"

namespace idemsaga::steps::guard {

// Returns "" when the body is acceptable, else a message naming the offending field.
using Validate = std::function<std::string(const nlohmann::json& body)>;
// The business effect of an action, inside the guard's transaction. Under
// EffectScope::kTransactionOnly it acts only through `tx` (it may run and be rolled back).
using RouteEffect = std::function<Response(pqxx::work& tx, const Request& req)>;
// Undoes a successful action inside the guard's transaction; returns details for the answer.
using RouteUndo =
    std::function<nlohmann::json(pqxx::work& tx, const Request& req, const ActionRecord& action)>;

// The longest step key accepted: an orchestrator's 200-byte parent key plus a derived suffix.
inline constexpr size_t kMaxStepKeyLength = common::kMaxDerivedKeyLength;

struct HttpGuardOptions {
  std::string service_token;  // what callers present as `Authorization: Bearer ...`
  common::http::Limits limits;
  // Where guarded requests are counted (null: nowhere), labelled with `service`:
  //   idemsaga_guard_requests_total{service,kind="action"|"compensation",outcome}
  // Actions: applied, replayed, reused (422), in_progress (409), tombstoned (refused: its
  // compensation came first), compensated (a retry of an undone action), action_unknown,
  // fenced. Compensations: undone, already_undone, nothing_to_undo, tombstoned (written
  // before its action), replayed. Either: refused (a 4xx before the guard), unavailable (503),
  // or what a hook answered with.
  common::metrics::Registry* metrics = nullptr;
  std::string service;
  // Tenants on several clusters: a tenant this cluster does not serve now (placed elsewhere,
  // or frozen by a move) is refused with 503 + Retry-After before the guard runs (outcome
  // "misplaced"). Null: every tenant is served. Must outlive the handlers.
  const common::pg::Placement* placement = nullptr;
};

// Around every guarded request, for a service that wants more than the guard (the demo
// participants' fault injection). Each may be empty; each returns nullopt to go on, or the
// outcome (a metrics label) it answered `res` with.
struct HttpGuardHooks {
  // Before the guard runs, once the request is admitted and valid.
  std::function<std::optional<std::string>(httplib::Response& res)> before;
  // The same, seeing what the guard would see (tenant, key, parsed body); runs after `before`.
  std::function<std::optional<std::string>(const Request& request, httplib::Response& res)>
      before_request;
  // Once the guard has answered and before the answer is written (it may drop the
  // connection instead); its outcome is counted besides the guard's.
  std::function<std::optional<std::string>(const Response& answer, httplib::Response& res)> after;
};

class HttpGuard {
 public:
  // `tracer` may be null (no spans).
  HttpGuard(Guard& guard, HttpGuardOptions options, const common::trace::Tracer* tracer = nullptr,
            HttpGuardHooks hooks = {});
  // Over a key store other than Guard (RedisGuard): the external routes, Policy() and Keys()
  // besides the edge's own; Action(), PlannedAction() and Compensation() need a Guard.
  HttpGuard(KeyStore& store, HttpGuardOptions options,
            const common::trace::Tracer* tracer = nullptr, HttpGuardHooks hooks = {});
  // The edge alone, for a store of the caller's own: only Guarded(), GuardedCompensation(),
  // Policy(retention), Keys(list) and Authorized() may be used.
  explicit HttpGuard(HttpGuardOptions options, const common::trace::Tracer* tracer = nullptr,
                     HttpGuardHooks hooks = {});

  using Handler = common::http::Server::Handler;
  // A store's guarded call: claim or replay and the effect, answered as Guard answers.
  using Run = std::function<Response(const Request& req)>;
  // A store's guarded compensation of the action under `action_key` (Guard::Compensate).
  using RunCompensation = std::function<Response(const Request& req, const std::string& action_key,
                                                 bool action_applied)>;
  using ListKeys = std::function<std::vector<protocol::KeyRecord>(
      const std::string& tenant_id, std::chrono::seconds since, const std::string& after,
      int limit)>;

  // POST handler of an action: `effect` runs at most once per (tenant, key).
  Handler Action(Validate validate, RouteEffect effect,
                 EffectScope scope = EffectScope::kTransactionOnly) const;
  // POST handler of an action planned in advance (Guard::RunPlanned): one statement per new key.
  Handler PlannedAction(Validate validate,
                        std::function<PlannedEffect(const Request& req)> plan) const;
  // POST handler of a compensation, whose body is {"action_key": "...", "action_applied":
  // true|false (optional)}: `undo` runs at most once for that action (Guard::Compensate).
  Handler Compensation(RouteUndo undo) const;
  // The same for an action whose effect, and its undo, are calls outside the store
  // (KeyStore::RunExternal, KeyStore::CompensateExternal): no transaction is open during them.
  Handler ExternalAction(Validate validate, ExternalEffect effect) const;
  Handler ExternalCompensation(ExternalUndo undo) const;
  // GET kPolicyPath: {"key_retention_seconds": N}, what an orchestrator checks at start-up.
  Handler Policy() const;
  // GET kKeysPath?tenant=T&since_seconds=S[&after=K][&limit=N] (service token): a tenant's
  // keys written in the last S seconds, N (1-1000, default 500) at a time in key order:
  // {"keys": [KeyRecord...], "next": the last key, or null at the end}. For reconciliation.
  Handler Keys() const;

  // What Action() and Compensation() do around a store of the caller's own: admission,
  // `validate`, the hooks, metrics, spans, and the answer (503 when `run` throws).
  Handler Guarded(const char* kind, Validate validate, Run run) const;
  Handler GuardedCompensation(RunCompensation run) const;
  Handler Policy(std::chrono::seconds retention) const;
  Handler Keys(ListKeys list) const;

  // True when the request carries the service token; otherwise answers 401.
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;

 private:
  // Auth, tenant, key and body; nullopt after answering a 4xx.
  std::optional<Request> Admit(const httplib::Request& req, httplib::Response& res) const;
  void Serve(const char* kind, const httplib::Request& req, httplib::Response& res,
             const std::function<std::string(const Request&)>& validate,
             const std::function<Response(const Request&)>& run) const;
  void Count(const char* kind, const std::string& outcome) const;

  Guard* guard_;               // null on any other store
  KeyStore* store_ = nullptr;  // null for a store of the caller's own
  HttpGuardOptions options_;
  const common::trace::Tracer* tracer_;
  HttpGuardHooks hooks_;
  common::metrics::Family<common::metrics::Counter>* requests_ = nullptr;
};

// Writes a guard's answer to `res`: its headers (Retry-After on 409 busy among them: Refuse)
// and Idempotent-Replayed.
void WriteAnswer(const Response& answer, httplib::Response& res);

}  // namespace idemsaga::steps::guard
