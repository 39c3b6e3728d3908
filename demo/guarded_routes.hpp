// A demo participant's guarded routes (not the participant service itself, demo/service.hpp; nor a
// team's idemsaga::Participant): the guard on its routes (steps::guard::HttpGuard, the same
// public call any service uses) with fault injection around it, and the admin, health and
// metrics routes.
//
// A participant whose store is not PostgreSQL (the inventory on Redis) is built without a
// pool: its routes wrap the store's calls (GuardedAction, GuardedCompensation) in the same edge.
//
// Thread-safe once routes are registered.
//   GuardedRoutes p("inventory", pool, faults, options);
//   p.Action(server, "/v1/reservations", ValidateReservation, Reserve);
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/http/server.hpp"
#include "common/pg/pool.hpp"
#include "demo/faults.hpp"
#include "demo/stack.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"
#include "steps/guard/queue_commands.hpp"

namespace idemsaga::demo {

struct ParticipantOptions {
  std::string service_token = kServiceToken;
  // OTLP/HTTP endpoint for this service's spans ("" sends none): the orchestrator's intake
  // (http://127.0.0.1:8080/v1/traces) or a collector of yours.
  std::string otlp_endpoint;
  // Sent with every export, and nothing else: idemsaga's own intake wants the service token
  // here (`Authorization: Bearer ...`); a collector of yours, its own credentials.
  std::map<std::string, std::string> otlp_headers;
  common::http::Limits limits;
  size_t pool_size = 16;
  steps::guard::GuardOptions guard;
  // Inventory only: "" keeps stock, reservations and keys in PostgreSQL; a
  // redis://host:port[/db] URL keeps them in that Redis instead, and no database is used.
  std::string redis_url;
  // With redis_url: the persistence Redis must have at start-up, "everysec" (appendonly yes,
  // appendfsync everysec or always), "always", or "unchecked" (steps::guard::RedisFsync).
  std::string redis_fsync = "everysec";
  // Tenants on several clusters: serve only those placed on this one (null: every tenant).
  // Owned by the caller; outlives the service.
  const common::pg::Placement* placement = nullptr;
  // Commands from RabbitMQ too (docs/messaging.md): no urls, none. `classify` is set by the
  // service (PostgreSQL's).
  steps::guard::QueueCommandsOptions amqp;
};

// A participant's action effect and compensation (steps/guard/http_guard.hpp); actions run
// with EffectScope::kTransactionOnly: they act only through `tx`.
using Validate = steps::guard::Validate;
using Effect = steps::guard::RouteEffect;
using Undo = steps::guard::RouteUndo;
using steps::guard::kMaxStepKeyLength;

// What a participant without a database asks its own store.
struct StoreHooks {
  std::function<bool()> ready;                  // GET /readyz
  steps::guard::HttpGuard::ListKeys list_keys;  // GET /v1/idempotency/keys (empty: not served)
};

class GuardedRoutes {
 public:
  // `tracer` may be null (no spans).
  GuardedRoutes(std::string service, common::pg::Pool& pool, Faults& faults,
                ParticipantOptions options, const common::trace::Tracer* tracer = nullptr);
  // No database: routes are added with GuardedAction and GuardedCompensation only.
  GuardedRoutes(std::string service, Faults& faults, ParticipantOptions options, StoreHooks store,
                const common::trace::Tracer* tracer = nullptr);

  void Action(common::http::Server& server, const std::string& path, Validate validate,
              Effect effect);
  // An action whose effect is one statement planned before it runs (Guard::RunPlanned).
  void PlannedAction(common::http::Server& server, const std::string& path, Validate validate,
                     std::function<steps::guard::PlannedEffect(const steps::guard::Request&)> plan);
  // The body is {"action_key": "..."}: the key of the action this compensation undoes.
  void Compensation(common::http::Server& server, const std::string& path, Undo undo);
  // The same around a store of the participant's own (steps::guard::HttpGuard::Guarded).
  void GuardedAction(common::http::Server& server, const std::string& path, Validate validate,
                     steps::guard::HttpGuard::Run run);
  void GuardedCompensation(common::http::Server& server, const std::string& path,
                           steps::guard::HttpGuard::RunCompensation run);
  // /healthz, /readyz, /metrics (guard outcomes), GET /v1/idempotency (the guard's key
  // retention), GET and PUT /admin/faults.
  void AdminRoutes(common::http::Server& server);

  // True when the request carries the service token; otherwise answers 401.
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;

  // Every guarded route by path: what commands from a queue are served by.
  const std::map<std::string, common::http::Server::Handler>& commands() const { return commands_; }
  common::metrics::Registry& metrics() { return metrics_; }

  // Only for a participant built with a pool.
  common::pg::Pool& pool() { return *pool_; }
  steps::guard::Guard& guard() { return *guard_; }

 private:
  // A guarded route: on the server, and among commands().
  void Post(common::http::Server& server, const std::string& path,
            common::http::Server::Handler handler);
  // Faults (hang, 503, latency, drop after commit) around each guarded request.
  steps::guard::HttpGuardHooks FaultHooks();

  std::string service_;
  // Guarded requests by outcome (steps::guard::HttpGuardOptions), injected faults among them
  // (unavailable, dropped), and the pool's waits.
  common::metrics::Registry metrics_;
  common::pg::Pool* pool_;  // null without a database
  Faults& faults_;
  ParticipantOptions options_;
  std::unique_ptr<steps::guard::Guard> guard_;  // null without a database
  StoreHooks store_;
  steps::guard::HttpGuard http_;
  std::map<std::string, common::http::Server::Handler> commands_;
};

}  // namespace idemsaga::demo
