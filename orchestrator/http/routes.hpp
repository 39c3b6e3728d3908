// Every route of the orchestrator, each group over the narrow set of objects it needs; the
// Orchestrator (the composition root) builds those objects and adds the groups to its server.
//
// Thread-safe once added (handlers run on the server's workers).
//   orchestrator::http::TenantAuth auth(store, std::chrono::seconds(30));
//   orchestrator::http::AddRunRoutes(server, {runs, registry, store, auth, limits});
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/trace/exporter.hpp"
#include "common/trace/span.hpp"
#include "orchestrator/recovery.hpp"
#include "orchestrator/saga_service.hpp"
#include "orchestrator/start_run.hpp"
#include "orchestrator/store/event_store.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/span_store.hpp"
#include "steps/saga/registry.hpp"

namespace orchestrator {

namespace http {

// The tenant whose API key is the request's bearer token, cached for `ttl` so that an order
// costs no query for it. Thread-safe.
class TenantAuth {
 public:
  TenantAuth(ParentStore& store, std::chrono::seconds ttl) : store_(store), ttl_(ttl) {}
  std::optional<std::string> operator()(const httplib::Request& req);

 private:
  ParentStore& store_;
  std::chrono::seconds ttl_;
  std::mutex mutex_;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> cache_;
};

// One saga's state as the API shows it (GET /v1/orders/{key}, /v1/runs/{saga}/{key}, /v1/sagas).
nlohmann::json SagaView(const SagaRow& row);

// The Idempotency-Key in a route's group `group` (the server has percent-decoded it), checked
// like a header key; otherwise answers 400 and returns nullopt.
std::optional<std::string> PathKey(const httplib::Request& req, httplib::Response& res,
                                   size_t group = 1);

// The calling tenant's saga under the path's key (group `group`); otherwise answers 401, 400
// or 404 and returns nullopt. Another tenant's key is indistinguishable from no key at all.
std::optional<SagaRow> PathSaga(const httplib::Request& req, httplib::Response& res,
                                TenantAuth& auth, ParentStore& store, size_t group = 1);

struct RunRoutes {
  const RunStarter& runs;
  const saga::Registry& registry;
  ParentStore& store;
  TenantAuth& auth;
  const common::http::Limits& limits;
};
// The HTTP adapter of the "start a run" use case (orchestrator/start_run.hpp) for the saga
// the path names: POST /v1/orders starts place_order, POST /v1/runs/{saga} the latest
// version of {saga}. Reads the caller (401), the Idempotency-Key (400) and the JSON body
// (400, 413, 415) off the request, starts the run, and writes its answer to `res`; with
// `early` (the route's), a run that outlives the response budget is answered 202 by it while
// the saga goes on. Returns what the key said: kNone when the request was refused before the
// key was consulted (nothing stored). Throws when the database fails (then nothing is
// answered, and a retry with the key is safe).
KeyOutcome StartRunAt(const RunRoutes& d, const httplib::Request& req, httplib::Response& res,
                      const common::http::EarlyAnswer& early = {});
// A RunOutcome as HTTP (run_answer.cpp), for a run of `saga` under `key`: the stored answer
// as stored, 202 + Location while it runs, or the problem for the rest.
void SendRunOutcome(const RunOutcome& outcome, const std::string& saga, const std::string& key,
                    httplib::Response& res);
// The orchestrator's one 409 idempotency_key_in_progress, with its Retry-After.
void SetInProgress(httplib::Response& res, std::chrono::seconds retry_after);

// POST /v1/orders (place_order), POST /v1/runs/{saga}, GET /v1/runs, GET /v1/runs/{saga}/{key},
// GET /v1/orders/{key}.
void AddRunRoutes(common::http::Server& server, const RunRoutes& deps);

struct EventRoutes {
  EventStore& events;
  const saga::Registry& registry;
  ParentStore& store;
  TenantAuth& auth;
  const common::http::Limits& limits;
};
// Delivers the event of an HTTP-shaped request as POST /v1/runs/{saga}/{key}/events/{name}
// does (auth, the run, the awaited event, its Idempotency-Key, the payload and the saga's
// parser, the store) and writes the answer to `res`; the request may have come another way
// (the AMQP intake builds one from a message): `req.path` is the route's path, with `/` and
// `%` in a segment percent-encoded (404 otherwise). Returns what the event's key said:
// kClaimed (stored), kReplayed, kMismatch (422), or kNone when refused with nothing stored.
// Throws when the database fails (nothing answered; a retry with the key is safe).
KeyOutcome DeliverEvent(const EventRoutes& d, const httplib::Request& req, httplib::Response& res);

// POST /v1/runs/{saga}/{key}/events/{name}.
void AddEventRoutes(common::http::Server& server, const EventRoutes& deps);

struct AdminRoutes {
  ParentStore& store;
  SagaService& sagas;
  Recovery& recovery;
  TenantAuth& auth;
  const common::metrics::Registry& metrics;
  const common::http::Limits& limits;
};
// GET /v1/sagas, POST /v1/sagas/{key}/retry|cancel|resolve, GET /metrics.
void AddAdminRoutes(common::http::Server& server, const AdminRoutes& deps);

struct TraceRoutes {
  SpanStore& spans;
  ParentStore& store;
  common::trace::Exporter& exporter;
  TenantAuth& auth;
  std::string service_token;         // what the OTLP intake requires
  std::chrono::milliseconds settle;  // how long a trace read waits for spans on their way
};
// POST /v1/traces (the OTLP intake) and GET /v1/orders/{key}/trace. Add these first:
// /v1/orders/{key}/trace must match before /v1/orders/{key}.
void AddTraceRoutes(common::http::Server& server, const TraceRoutes& deps);

}  // namespace http
}  // namespace orchestrator
