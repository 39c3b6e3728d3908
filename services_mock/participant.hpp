// The plumbing every participant route shares, so a service only writes validation and effect:
// service-token auth and tenant scope, the Idempotency-Key, the JSON body, the guard, the
// replay header, fault injection, and the admin/health routes.
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

// Returns "" when `body` is acceptable, else a message naming the offending field.
using Validate = std::function<std::string(const nlohmann::json& body)>;

// The business effect of an action, run by the guard inside its transaction. It acts only
// through `tx` (steps::guard::EffectScope::kTransactionOnly): it may run and be rolled back.
using Effect =
    std::function<steps::guard::Response(pqxx::work& tx, const steps::guard::Request& req)>;
// Undoes a successful action inside the guard's transaction; returns details for the answer.
using Undo = std::function<nlohmann::json(pqxx::work& tx, const steps::guard::Request& req,
                                          const steps::guard::ActionRecord& action)>;

// The longest key a participant accepts (the orchestrator's 200 plus a derived suffix).
inline constexpr size_t kMaxStepKeyLength = 255;

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
  // Auth, tenant, key and body; nullopt after answering a 4xx.
  std::optional<steps::guard::Request> Admit(const httplib::Request& req,
                                             httplib::Response& res) const;
  void Answer(const steps::guard::Response& answer, httplib::Response& res);
  // The request's span, a child of the caller's `traceparent`.
  common::trace::Span StartRequestSpan(const httplib::Request& req) const;
  // Runs a guarded route: admission, faults, the guard call, the answer, the span.
  void Guarded(const httplib::Request& req, httplib::Response& res,
               const std::function<std::string(const steps::guard::Request&)>& validate,
               const std::function<steps::guard::Response(const steps::guard::Request&)>& run);

  // Guarded requests by outcome: the guard's (applied, replayed, mismatch, cancelled,
  // compensated, in_progress) and the route's (refused: a 4xx before the guard; unavailable:
  // a 503; dropped: an injected drop). Keys fixed at construction: lock-free counting.
  void Count(const std::string& outcome);
  std::string MetricsText() const;

  std::map<std::string, std::atomic<long long>> outcomes_;
  std::string service_;
  common::pg::Pool& pool_;
  Faults& faults_;
  ParticipantOptions options_;
  const common::trace::Tracer* tracer_;
  steps::guard::Guard guard_;
};

}  // namespace services_mock
