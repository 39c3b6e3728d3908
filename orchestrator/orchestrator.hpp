// The coordinator service's composition root: builds the parent-key store, the participant
// clients, the saga registry, the saga service, recovery, the retention check, the reconcile
// job and the server, adds the routes (orchestrator/http/), and starts and stops them, as one
// object that main() or a test runs. It holds no job of its own: each lives in its own file.
//
// Bind() and Serve() from one thread; Stop() from any but its own handlers (the server's stop
// waits for them).
//   orchestrator::Orchestrator o({.database_url = url, .participants = {...},
//                                 .service_token = token});
//   int port = o.Bind("127.0.0.1", 0); std::thread t([&] { o.Serve(); }); ...; o.Stop();
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/http/server.hpp"
#include "common/metrics.hpp"
#include "common/pg/pool.hpp"
#include "common/trace/exporter.hpp"
#include "common/trace/span.hpp"
#include "orchestrator/http/routes.hpp"
#include "orchestrator/receive_event.hpp"
#include "orchestrator/reconcile_job.hpp"
#include "orchestrator/recovery.hpp"
#include "orchestrator/retention_check.hpp"
#include "orchestrator/saga_service.hpp"
#include "orchestrator/start_run.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/reply_store.hpp"
#include "orchestrator/store/span_store.hpp"
#include "orchestrator/tenant_auth.hpp"
#include "steps/client/participants.hpp"
#include "steps/saga/definition.hpp"
#include "steps/saga/registry.hpp"
#include "steps/saga/runner.hpp"
#include "steps/sagas.hpp"

namespace idemsaga::orchestrator {

struct OrchestratorOptions {
  std::string database_url;
  // Participant name -> its base URL and declared business refusals; none by default (the
  // demo's are in demo/stack.hpp). An entry without a URL is not configured: a saga that calls
  // it is not served here. Every client sends `service_token`, which has no default either: the
  // constructor throws when a participant is configured without one, or when sagas were given
  // and none of them can be served.
  std::map<std::string, steps::client::HttpParticipantClient::Options> participants;
  std::string service_token;
  // Participants reached another way than HTTP, by name (over a queue:
  // orchestrator/amqp/step_queue.hpp, linked only by the processes that take that way): each
  // made once, in the constructor, over this orchestrator's reply store. A name here is not
  // also an HTTP participant.
  using ParticipantMaker = std::function<std::unique_ptr<idemsaga::ParticipantClient>(
      store::ReplyStore&, common::metrics::Registry&)>;
  std::map<std::string, ParticipantMaker> other_participants;
  // Per call to a participant (the step deadline bounds all of a step's attempts).
  std::chrono::milliseconds participant_timeout{5000};
  // The bulkhead: calls in flight to each participant at most (0: no limit); a step past it
  // waits, parked, instead of holding a thread (ParticipantClient::Options::max_in_flight).
  size_t participant_max_in_flight = 64;
  steps::saga::RetryPolicy retry;
  store::StoreOptions store;
  SagaServiceOptions sagas;
  RecoveryOptions recovery;
  common::http::Limits limits;
  size_t pool_size = 32;
  // How long a tenant's API key is trusted without asking the database again.
  std::chrono::seconds tenant_cache_ttl{30};
  // Where this service's spans go: "" stores them in its own database (batched, off the
  // request path); an OTLP/HTTP URL (a collector, Jaeger, Tempo) sends them there instead.
  std::string otlp_endpoint;
  // Sent with every export to `otlp_endpoint` (a collector's credentials), and nothing else.
  std::map<std::string, std::string> otlp_headers;
  common::trace::Exporter::Options exporter;
  // How long GET .../trace waits for spans still on their way from participants.
  std::chrono::milliseconds trace_settle{1500};
  // How often this process reconciles the window below with the participants (0: never);
  // idemsaga_reconcile_discrepancies says what the last run found.
  std::chrono::milliseconds reconcile_interval{std::chrono::minutes(15)};
  std::chrono::seconds reconcile_since{std::chrono::hours(1)};
  // Tenants on several clusters (common/pg/placement.hpp): the directory database's URL and the
  // cluster this orchestrator's database is on. Both empty: every tenant is served here.
  std::string placement_url;
  std::string cluster;
};

// The participants the sagas call: the HTTP ones, and those reached another way.
class SagaParticipants final : public idemsaga::Participants {
 public:
  SagaParticipants(const steps::client::Participants& http,
                   std::map<std::string, std::unique_ptr<idemsaga::ParticipantClient>> others)
      : http_(http), others_(std::move(others)) {}
  idemsaga::ParticipantClient& Get(const std::string& name) const override;
  bool Has(const std::string& name) const override {
    return others_.count(name) != 0 || http_.Has(name);
  }

 private:
  const steps::client::Participants& http_;
  std::map<std::string, std::unique_ptr<idemsaga::ParticipantClient>> others_;
};

class Orchestrator {
 public:
  // Serves the sagas `sagas` make over the configured participants: the product's by default;
  // a user's own, or both (a factory's nullopt: that saga is not served here). Throws
  // std::invalid_argument (a bad or duplicate definition) or std::out_of_range (a saga that calls a
  // participant that is not configured).
  explicit Orchestrator(OrchestratorOptions options,
                        const std::vector<steps::SagaFactory>& sagas = steps::ShippedSagas());
  ~Orchestrator();

  int Bind(const std::string& host, int port);
  void Serve();
  // Stops accepting, lets running sagas finish for up to `grace`, stops the rest at their
  // next step boundary and releases their leases so another replica resumes them at once.
  void Shutdown(std::chrono::milliseconds grace);
  void Stop() { Shutdown(std::chrono::milliseconds(0)); }

  // The start-up check of the participants' key retention (RetentionCheck::Run): call it
  // before Serve(). Throws std::runtime_error; returns how many participants were checked.
  int CheckParticipantRetention() { return retention_check_.Run(); }
  // This orchestrator's retention plus its longest saga.
  std::chrono::seconds RequiredParticipantRetention() const { return retention_check_.required(); }

  // The use cases and who a caller is, for the adapters of the process's own (the
  // in-process client, the AMQP intake).
  const RunStarter& runs() const { return runs_; }
  const EventReceiver& events() const { return receiver_; }
  TenantAuth& auth() { return auth_; }
  store::ParentStore& store() { return store_; }
  // What saga steps over a queue keep (the replies' consumer stores into it).
  store::ReplyStore& replies() { return replies_; }
  // One reconciliation of `since` against every configured participant (what the periodic
  // job runs; also counted in the metrics).
  ReconcileReport Reconcile(std::chrono::seconds since) { return reconcile_job_.Run(since); }
  const steps::saga::Registry& registry() const { return registry_; }
  common::trace::Exporter& exporter() { return exporter_; }
  const common::metrics::Registry& metrics() const { return metrics_; }
  common::metrics::Registry& metrics() { return metrics_; }
  const common::http::Server& server() const { return server_; }

 private:
  // Connects the counts kept elsewhere (store, pools, exporter, recovery) to metrics_.
  void AddMetrics();

  OrchestratorOptions options_;
  common::metrics::Registry metrics_;  // first: every other member may count into it
  common::pg::Pool pool_;
  store::SpanRides span_rides_;  // spans riding on store_'s finishes, from span_store_
  store::ParentStore store_;
  store::EventStore events_;
  store::ReplyStore replies_;
  // Span batches (up to a few MB of JSON) on their own two connections: libpq never shrinks a
  // connection's buffers, and spread over the order pool they held megabytes on every one.
  common::pg::Pool span_pool_;
  store::SpanStore span_store_;
  common::trace::Exporter exporter_;
  common::trace::Tracer tracer_;
  steps::client::Participants participants_;
  SagaParticipants saga_participants_;
  steps::saga::Registry registry_;
  SagaService sagas_;
  RunStarter runs_;
  EventReceiver receiver_;
  Recovery recovery_;
  std::unique_ptr<common::pg::Placement> placement_;  // null: one cluster serves every tenant
  TenantAuth auth_;
  common::http::Server server_;
  RetentionCheck retention_check_;
  ReconcileJob reconcile_job_;  // after all it uses
  std::once_flag shutdown_once_;
};

// "host:pid:random": unique per process, readable in the parent row and the logs.
std::string MakeOwnerId();

}  // namespace idemsaga::orchestrator
