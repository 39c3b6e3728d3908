#include "orchestrator/orchestrator.hpp"

#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "common/crypto.hpp"
#include "common/log.hpp"
#include "common/pg/errors.hpp"
#include "common/trace/otlp.hpp"
#include "orchestrator/http/pages.hpp"

namespace idemsaga::orchestrator {
namespace {

steps::client::Participants MakeParticipants(const OrchestratorOptions& o) {
  steps::client::Participants participants;
  for (auto [name, client] : o.participants) {
    if (client.base_url.empty()) continue;  // not configured
    if (o.service_token.empty()) {
      throw std::invalid_argument(
          "orchestrator: no service token to present to participant " + name +
          " (OrchestratorOptions::service_token; --service-token or IDEMSAGA_SERVICE_TOKEN)");
    }
    client.service_token = o.service_token;
    client.read_timeout = o.participant_timeout;
    client.max_in_flight = o.participant_max_in_flight;
    participants.Add(name, std::move(client));
  }
  return participants;
}

// What the reconciler reads: every configured participant, with the token the sagas use.
std::map<std::string, ReconcileParticipant> ReconcileParticipants(const OrchestratorOptions& o) {
  std::map<std::string, ReconcileParticipant> participants;
  for (const auto& [name, p] : o.participants) {
    if (!p.base_url.empty()) participants[name] = {p.base_url, o.service_token};
  }
  return participants;
}

std::map<std::string, std::unique_ptr<idemsaga::ParticipantClient>> MakeOtherParticipants(
    const OrchestratorOptions& o, store::ReplyStore& replies, common::metrics::Registry& metrics) {
  std::map<std::string, std::unique_ptr<idemsaga::ParticipantClient>> made;
  for (const auto& [name, make] : o.other_participants) {
    auto http = o.participants.find(name);
    if (http != o.participants.end() && !http->second.base_url.empty()) {
      throw std::invalid_argument("orchestrator: participant " + name +
                                  " is configured both over HTTP and another way");
    }
    made[name] = make(replies, metrics);
  }
  return made;
}

}  // namespace

idemsaga::ParticipantClient& SagaParticipants::Get(const std::string& name) const {
  auto other = others_.find(name);
  if (other != others_.end()) return *other->second;
  return http_.Get(name);
}

std::string MakeOwnerId() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + common::RandomHex(3);
}

Orchestrator::Orchestrator(OrchestratorOptions options,
                           const std::vector<steps::SagaFactory>& sagas)
    : options_(std::move(options)),
      pool_({.url = options_.database_url, .size = options_.pool_size}),
      span_rides_({}),
      store_(pool_, options_.store, &span_rides_),
      events_(pool_),
      replies_(pool_),
      span_pool_({.url = options_.database_url, .size = 2}),
      span_store_(span_pool_, &span_rides_),
      exporter_(
          options_.otlp_endpoint.empty()
              ? common::trace::Exporter::Sink([this](const auto& spans) {
                  span_store_.Insert(spans);
                  return true;
                })
              : common::trace::Exporter::OtlpHttp(options_.otlp_endpoint, options_.otlp_headers),
          options_.exporter),
      tracer_("orchestrator", &exporter_),
      participants_(MakeParticipants(options_)),
      saga_participants_(participants_, MakeOtherParticipants(options_, replies_, metrics_)),
      registry_([&] {
        steps::saga::Registry registry;
        for (const auto& make : sagas) {
          if (auto saga = make(saga_participants_)) registry.Add(std::move(*saga));
        }
        // No participant configured is a misconfiguration, not an orchestrator serving nothing.
        if (!sagas.empty() && registry.All().empty()) {
          throw std::invalid_argument(
              "orchestrator: none of its sagas can be served: no participant they call has a URL "
              "(OrchestratorOptions::participants; --participant NAME=URL)");
        }
        return registry;
      }()),
      sagas_(
          store_, events_, registry_, options_.retry,
          [&] {
            auto s = options_.sagas;
            if (s.owner.empty()) s.owner = MakeOwnerId();
            return s;
          }(),
          &tracer_, &metrics_),
      runs_(sagas_, registry_, tracer_),
      receiver_(events_, registry_, store_),
      recovery_(store_, span_store_, sagas_, options_.recovery),
      placement_(common::pg::Placement::FromFlags(options_.placement_url, options_.cluster)),
      auth_(store_, options_.tenant_cache_ttl, placement_.get()),
      server_(
          [this] {
            auto limits = options_.limits;
            limits.large_bodies["/v1/traces"] = common::trace::kMaxOtlpBody;
            return limits;
          }(),
          common::pg::Classify),
      retention_check_(participants_, orchestrator::RequiredParticipantRetention(
                                          registry_, options_.retry, options_.store.retention)),
      reconcile_job_(store_, ReconcileParticipants(options_),
                     {.interval = options_.reconcile_interval, .since = options_.reconcile_since},
                     metrics_) {
  common::http::AddHealthRoutes(server_, [this] { return common::pg::Reachable(pool_); });
  http::AddTraceRoutes(server_, {span_store_, store_, exporter_, auth_, options_.service_token,
                                 options_.trace_settle});
  http::AddRunRoutes(server_, {runs_, registry_, store_, auth_, options_.limits});
  http::AddEventRoutes(server_, {receiver_, auth_, options_.limits});
  http::AddAdminRoutes(server_, {store_, sagas_, recovery_, auth_, metrics_, options_.limits});
  http::AddPageRoutes(server_, registry_);
  AddMetrics();
}

void Orchestrator::AddMetrics() {
  auto& m = metrics_;
  m.CounterFrom("idemsaga_fenced_writes_total",
                "Writes refused because this process had lost the saga's lease.",
                [this] { return static_cast<double>(store_.fenced_writes()); });
  m.CounterFrom("idemsaga_sagas_resumed_total",
                "Sagas this process took over from an expired lease (recovery).",
                [this] { return static_cast<double>(sagas_.resumed()); });
  m.GaugeFrom("idemsaga_sagas_in_process", "Sagas running or queued in this process.",
              [this] { return static_cast<double>(sagas_.running()); });
  // One query per scrape for the gauges over every replica.
  auto& running =
      m.Gauge("idemsaga_sagas_running", "Sagas not yet ended, in all replicas.").With({});
  auto& stuck = m.Gauge("idemsaga_sagas_stuck",
                        "Sagas marked stuck (a compensation keeps failing, or a step is "
                        "blocked on a configuration fault), in all replicas.")
                    .With({});
  auto& up =
      m.Gauge("idemsaga_database_up", "Whether the database answered the last scrape.").With({});
  m.OnScrape([this, &running, &stuck, &up] {
    try {
      auto counts = store_.CountRunning();
      running.Set(static_cast<double>(counts.running));
      stuck.Set(static_cast<double>(counts.stuck));
      up.Set(1);
    } catch (const std::exception&) {
      up.Set(0);
    }
  });
  common::pg::AddMetrics(m, pool_);
  m.CounterFrom("idemsaga_spans_dropped_total",
                "Spans dropped by the exporter (queue full, or the store refused a batch).",
                [this] { return static_cast<double>(exporter_.dropped()); });
  m.CounterFrom("idemsaga_spans_exported_total", "Spans the exporter delivered.",
                [this] { return static_cast<double>(exporter_.exported()); });
  m.CounterFrom("idemsaga_span_rows_carried_total",
                "Span rows (a trace's spans of one batch) stored by a saga's finish statement.",
                [this] { return static_cast<double>(span_rides_.carried()); });
  m.CounterFrom("idemsaga_span_rows_alone_total",
                "Span rows stored by a statement of their own (no finish took them).",
                [this] { return static_cast<double>(span_rides_.alone()); });
}

Orchestrator::~Orchestrator() { Stop(); }

int Orchestrator::Bind(const std::string& host, int port) {
  int bound = server_.Bind(host, port);
  if (bound < 0) {
    throw std::runtime_error("orchestrator: cannot listen on " + host + ":" + std::to_string(port));
  }
  return bound;
}

void Orchestrator::Serve() {
  // Recovery starts with serving, not at construction: a process that fails its start-up
  // checks never takes over anyone's saga.
  recovery_.Start();
  reconcile_job_.Start();
  server_.Serve();
}

void Orchestrator::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(shutdown_once_, [&] {
    // A request runs its saga on a server worker, and the server's stop waits for its
    // workers: it stops on a thread of its own while the sagas get their grace period.
    std::thread server_stop([this] { server_.Stop(); });
    struct Join {  // on an exception: the sagas must stop, or the server's stop never ends
      std::thread& t;
      SagaService& sagas;
      ~Join() {
        if (!t.joinable()) return;
        sagas.Shutdown();
        t.join();
      }
    } join_server_stop{server_stop, sagas_};
    recovery_.Stop();
    reconcile_job_.Stop();
    auto deadline = std::chrono::steady_clock::now() + grace;
    while (sagas_.running() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    long long unfinished = sagas_.running();
    sagas_.Shutdown();
    server_stop.join();  // and with it every saga still on a worker: none holds a lease now
    try {
      long long released = store_.ReleaseLeases(sagas_.owner());
      common::Log("shutdown", {{"owner", sagas_.owner()},
                               {"unfinished_sagas", std::to_string(unfinished)},
                               {"leases_released", std::to_string(released)}});
    } catch (const std::exception& e) {
      // The leases expire on their own; recovery is only slower.
      common::Log("shutdown_release_failed", {{"owner", sagas_.owner()}, {"error", e.what()}});
    }
  });
}

}  // namespace idemsaga::orchestrator
