// Every route of the orchestrator, each group over the narrow set of objects it needs; the
// Orchestrator (the composition root) builds those objects and adds the groups to its server.
//
// Thread-safe once added (handlers run on the server's workers).
//   orchestrator::TenantAuth auth(store, std::chrono::seconds(30));
//   orchestrator::http::AddRunRoutes(server, {runs, registry, store, auth, limits});
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/trace/exporter.hpp"
#include "common/trace/span.hpp"
#include "orchestrator/http/answers.hpp"
#include "orchestrator/recovery.hpp"
#include "orchestrator/saga_service.hpp"
#include "orchestrator/start_run.hpp"
#include "orchestrator/store/event_store.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/span_store.hpp"
#include "orchestrator/tenant_auth.hpp"
#include "steps/saga/registry.hpp"

namespace idemsaga::orchestrator::http {

// The tenant whose API key is the request's bearer token (TenantAuth), or nullopt.
std::optional<std::string> Tenant(TenantAuth& auth, const httplib::Request& req);

// One saga's state as the API shows it (GET /v1/orders/{key}, /v1/runs/{saga}/{key}, /v1/sagas).
nlohmann::json SagaView(const store::SagaRow& row);

// The Idempotency-Key in a route's group `group` (the server has percent-decoded it), checked
// like a header key; otherwise answers 400 and returns nullopt.
std::optional<std::string> PathKey(const httplib::Request& req, httplib::Response& res,
                                   size_t group = 1);

// The calling tenant's saga under the path's key (group `group`); otherwise answers 401, 400
// or 404 and returns nullopt. Another tenant's key is indistinguishable from no key at all.
std::optional<store::SagaRow> PathSaga(const httplib::Request& req, httplib::Response& res,
                                       TenantAuth& auth, store::ParentStore& store,
                                       size_t group = 1);

struct RunRoutes {
  const RunStarter& runs;
  const steps::saga::Registry& registry;
  store::ParentStore& store;
  TenantAuth& auth;
  const common::http::Limits& limits;
};
// POST /v1/orders (place_order), POST /v1/runs/{saga}, GET /v1/runs, GET /v1/runs/{saga}/{key},
// GET /v1/orders/{key}.
void AddRunRoutes(common::http::Server& server, const RunRoutes& deps);

struct EventRoutes {
  const EventReceiver& events;
  TenantAuth& auth;
  const common::http::Limits& limits;
};
// POST /v1/runs/{saga}/{key}/events/{name}.
void AddEventRoutes(common::http::Server& server, const EventRoutes& deps);

struct AdminRoutes {
  store::ParentStore& store;
  SagaService& sagas;
  Recovery& recovery;
  TenantAuth& auth;
  const common::metrics::Registry& metrics;
  const common::http::Limits& limits;
};
// GET /v1/sagas, POST /v1/sagas/{key}/retry|cancel|resolve, GET /metrics.
void AddAdminRoutes(common::http::Server& server, const AdminRoutes& deps);

struct TraceRoutes {
  store::SpanStore& spans;
  store::ParentStore& store;
  common::trace::Exporter& exporter;
  TenantAuth& auth;
  std::string service_token;         // what the OTLP intake requires
  std::chrono::milliseconds settle;  // how long a trace read waits for spans on their way
};
// POST /v1/traces (the OTLP intake) and GET /v1/orders/{key}/trace. Add these first:
// /v1/orders/{key}/trace must match before /v1/orders/{key}.
void AddTraceRoutes(common::http::Server& server, const TraceRoutes& deps);

}  // namespace idemsaga::orchestrator::http
