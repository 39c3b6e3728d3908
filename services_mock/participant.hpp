// A demo participant's plumbing: the guard on its routes (steps::guard::HttpGuard, the same
// public call any service uses) with fault injection around it, and the admin, health and
// metrics routes.
//
// Thread-safe once routes are registered.
//   Participant p("inventory", pool, faults, options);
//   p.Action(server, "/v1/reservations", ValidateReservation, Reserve);
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/defaults.hpp"
#include "common/http/server.hpp"
#include "common/pg/pool.hpp"
#include "services_mock/faults.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"

namespace services_mock {

struct ParticipantOptions {
  std::string service_token = common::defaults::kServiceToken;
  // OTLP/HTTP endpoint for this service's spans ("" sends none): the orchestrator's intake
  // (http://127.0.0.1:8080/v1/traces) or a collector of yours.
  std::string otlp_endpoint;
  // Sent with every export, and nothing else: idemsaga's own intake wants the service token
  // here (`Authorization: Bearer ...`); a collector of yours, its own credentials.
  std::map<std::string, std::string> otlp_headers;
  common::http::Limits limits;
  size_t pool_size = 16;
  steps::guard::GuardOptions guard;
};

// A participant's action effect and compensation (steps/guard/http_guard.hpp); actions run
// with EffectScope::kTransactionOnly: they act only through `tx`.
using Validate = steps::guard::Validate;
using Effect = steps::guard::RouteEffect;
using Undo = steps::guard::RouteUndo;
using steps::guard::kMaxStepKeyLength;

class Participant {
 public:
  // `tracer` may be null (no spans).
  Participant(std::string service, common::pg::Pool& pool, Faults& faults,
              ParticipantOptions options, const common::trace::Tracer* tracer = nullptr);

  void Action(common::http::Server& server, const std::string& path, Validate validate,
              Effect effect);
  // The body is {"action_key": "..."}: the key of the action this compensation undoes.
  void Compensation(common::http::Server& server, const std::string& path, Undo undo);
  // /healthz, /readyz, /metrics (guard outcomes), GET /v1/idempotency (the guard's key
  // retention), GET and PUT /admin/faults.
  void AdminRoutes(common::http::Server& server);

  // True when the request carries the service token; otherwise answers 401.
  bool Authorized(const httplib::Request& req, httplib::Response& res) const;

  common::pg::Pool& pool() { return pool_; }
  steps::guard::Guard& guard() { return guard_; }

 private:
  // Faults (hang, 503, latency, drop after commit) around each guarded request.
  steps::guard::HttpGuardHooks FaultHooks();

  std::string service_;
  // Guarded requests by outcome (steps::guard::HttpGuardOptions), injected faults among them
  // (unavailable, dropped), and the pool's waits.
  common::metrics::Registry metrics_;
  common::pg::Pool& pool_;
  Faults& faults_;
  ParticipantOptions options_;
  steps::guard::Guard guard_;
  steps::guard::HttpGuard http_;
};

}  // namespace services_mock
