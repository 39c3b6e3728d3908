#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cmd/idemsaga/commands.hpp"
#include "cmd/idemsaga/signals.hpp"
#include "common/defaults.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "orchestrator/amqp/intake.hpp"
#include "orchestrator/orchestrator.hpp"
#include "services_mock/service.hpp"

namespace idemsaga_cmd {
namespace {

using services_mock::ParticipantKind;
using services_mock::ParticipantService;

struct ParticipantFlags {
  std::string listen;
  std::string database_url;
  std::string service_token = common::defaults::kServiceToken;
  std::string otlp_endpoint;
  std::vector<std::string> otlp_headers;
  bool migrate = false;
  int retention_hours = 24 * 7;
  std::string duplicates = "wait";
  std::string store = "postgres";
  std::string redis_url = "redis://127.0.0.1:6379";
  std::string redis_fsync = "everysec";
  services_mock::FaultSettings faults;
};

// Where `idemsaga <participant>` listens unless told: the ports `idemsaga dev` uses too.
std::string DefaultListen(ParticipantKind kind) {
  switch (kind) {
    case ParticipantKind::kInventory:
      return common::defaults::LocalListen(common::defaults::kInventoryPort);
    case ParticipantKind::kPayment:
      return common::defaults::LocalListen(common::defaults::kPaymentPort);
    case ParticipantKind::kShipping:
      return common::defaults::LocalListen(common::defaults::kShippingPort);
  }
  throw std::invalid_argument("unknown participant kind");
}

void AddParticipantCommand(CLI::App& app, ParticipantKind kind, Run& run) {
  auto flags_ptr = std::make_shared<ParticipantFlags>();
  auto& flags = *flags_ptr;
  const std::string name = services_mock::NameOf(kind);
  auto* cmd = app.add_subcommand(name, "Run the demo " + name + " participant");
  flags.listen = DefaultListen(kind);
  std::string upper_name = name;
  for (char& c : upper_name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", flags.database_url,
                  "postgresql:// URL of its database (required unless --store redis)")
      ->envname("IDEMSAGA_" + upper_name + "_DATABASE_URL");
  if (kind == ParticipantKind::kInventory) {
    cmd->add_option("--store", flags.store,
                    "where stock, reservations and keys live: postgres (--database-url) or "
                    "redis (--redis-url)")
        ->check(CLI::IsMember({"postgres", "redis"}))
        ->envname("IDEMSAGA_INVENTORY_STORE")
        ->capture_default_str();
    cmd->add_option("--redis-url", flags.redis_url, "redis://HOST:PORT[/DB] with --store redis")
        ->envname("IDEMSAGA_INVENTORY_REDIS_URL")
        ->capture_default_str();
    cmd->add_option("--redis-fsync", flags.redis_fsync,
                    "the persistence Redis must have at start-up: everysec (appendonly yes; a "
                    "crash may lose ~1 s of keys), always (appendfsync always), or unchecked")
        ->check(CLI::IsMember({"everysec", "always", "unchecked"}))
        ->envname("IDEMSAGA_INVENTORY_REDIS_FSYNC")
        ->capture_default_str();
  } else {
    // Only the inventory has a Redis store: say so rather than "unknown option".
    cmd->add_option_function<std::string>(
           "--store",
           [name](const std::string& store) {
             if (store != "postgres") {
               throw CLI::ValidationError("--store", name +
                                                         " keeps its store in PostgreSQL only; "
                                                         "--store redis is for the inventory");
             }
           },
           "postgres (the only store of the " + name + ")")
        ->envname("IDEMSAGA_" + upper_name + "_STORE");
  }
  cmd->add_option("--service-token", flags.service_token,
                  "bearer token callers must present (dev default: dev-service-token)")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cmd->add_flag("--migrate", flags.migrate, "apply pending migrations before serving");
  cmd->add_option("--otlp-endpoint", flags.otlp_endpoint,
                  "where spans go (OTLP/HTTP JSON), e.g. the orchestrator's "
                  "http://127.0.0.1:8080/v1/traces; none by default");
  AddOtlpHeaderOption(cmd, flags.otlp_headers);
  cmd->add_option("--retention-hours", flags.retention_hours,
                  "how long step keys are kept (must exceed the orchestrator's retention plus "
                  "its longest saga; it checks at start-up)")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  cmd->add_option("--duplicates", flags.duplicates,
                  "a request whose key a concurrent duplicate holds: wait for it and replay its "
                  "answer, or fail-fast with 409 + Retry-After (an advisory lock)")
      ->check(CLI::IsMember({"wait", "fail-fast"}))
      ->capture_default_str();
  cmd->add_option("--fault-error-rate", flags.faults.error_rate, "share of requests answered 503")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-drop-rate", flags.faults.drop_after_commit_rate,
                  "share of requests committed, then dropped without an answer")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-latency-ms", flags.faults.latency_ms, "delay added to every answer")
      ->check(CLI::Range(0, 600000));
  cmd->callback([flags_ptr, kind, &run] {
    auto& flags = *flags_ptr;
    const bool redis = flags.store == "redis";
    if (!redis && flags.database_url.empty()) {
      throw CLI::RequiredError("--database-url");
    }
    if (redis && flags.migrate) {
      throw CLI::ValidationError("--migrate", "there is nothing to migrate with --store redis");
    }
    run = [flags_ptr, kind, redis] {
      auto& flags = *flags_ptr;
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.database_url));
        common::pg::Migrate(conn, services_mock::NameOf(kind));
      }
      auto [host, port] = common::SplitHostPort(flags.listen);
      ParticipantService svc(
          kind, flags.database_url,
          {.service_token = flags.service_token,
           .otlp_endpoint = flags.otlp_endpoint,
           .otlp_headers = ParseHeaders(flags.otlp_headers),
           .guard = {.retention = std::chrono::hours(flags.retention_hours),
                     .duplicates = *steps::guard::ParseDuplicates(flags.duplicates)},
           .redis_url = redis ? flags.redis_url : "",
           .redis_fsync = flags.redis_fsync},
          flags.faults);
      int bound = svc.Bind(host, port);
      std::thread server([&] { svc.Serve(); });
      std::cout << services_mock::NameOf(kind) << " ready on http://" << host << ":" << bound
                << std::endl;
      int sig = idemsaga_cmd::WaitForStopSignal();
      common::Log("shutdown",
                  {{"service", services_mock::NameOf(kind)}, {"signal", std::to_string(sig)}});
      svc.Stop();
      server.join();
    };
  });
}

struct OrchestratorFlags {
  std::string listen = common::defaults::LocalListen(common::defaults::kOrchestratorPort);
  std::vector<std::string> otlp_headers;
  bool migrate = false;
  int retention_hours = 24;
  steps::PlaceOrderOptions place_order;
  std::chrono::milliseconds grace{10000};
  std::vector<std::string> participants;  // NAME=URL
  orchestrator::OrchestratorOptions options;
  orchestrator::amqp::IntakeOptions amqp;  // no url: no intake
  std::string amqp_events_queue;           // "": <amqp.queue>.events
};

}  // namespace

void AddParticipantCommands(CLI::App& app, Run& run) {
  for (auto kind :
       {ParticipantKind::kInventory, ParticipantKind::kPayment, ParticipantKind::kShipping}) {
    AddParticipantCommand(app, kind, run);
  }
}

void AddOrchestratorCommand(CLI::App& app, Run& run) {
  auto flags_ptr = std::make_shared<OrchestratorFlags>();
  auto& flags = *flags_ptr;
  auto* cmd = app.add_subcommand("orchestrator", "Run the coordinator service (order API)");
  auto& o = flags.options;
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", o.database_url, "postgresql:// URL of its database")
      ->envname("IDEMSAGA_DATABASE_URL")
      ->required();
  cmd->add_option("--participant", flags.participants,
                  "NAME=URL: where the participant NAME is (repeatable; defaults: "
                  "inventory=http://127.0.0.1:8081, payment=...:8082; ship_order and deliver_order "
                  "are served only with shipping=URL)")
      ->envname("IDEMSAGA_PARTICIPANTS")
      ->delimiter(',')
      ->check(CheckParticipantFlag);
  for (std::string name : {"inventory", "payment"}) {  // the flags before --participant
    cmd->add_option_function<std::string>(
        "--" + name + "-url",
        [&o, name](const std::string& url) { o.participants[name].base_url = url; },
        "same as --participant " + name + "=URL");
  }
  cmd->add_option("--service-token", o.service_token, "token presented to participants")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cmd->add_flag("--migrate", flags.migrate, "apply pending migrations before serving");
  cmd->add_option("--max-attempts", o.retry.max_attempts,
                  "attempts per step action (the step deadline usually ends retries first)")
      ->capture_default_str();
  cmd->add_option("--step-deadline-ms", o.retry.step_deadline,
                  "no new attempt of a step's action after this (rides out a participant "
                  "restart)")
      ->capture_default_str();
  cmd->add_option("--initial-backoff-ms", o.retry.initial_backoff,
                  "full-jitter backoff: first cap, doubled per attempt")
      ->capture_default_str();
  cmd->add_option("--max-backoff-ms", o.retry.max_backoff, "largest backoff between attempts")
      ->capture_default_str();
  cmd->add_option("--lease-seconds", o.store.lease, "saga lease, renewed while it runs")
      ->capture_default_str();
  cmd->add_option("--response-budget-ms", o.sagas.response_budget,
                  "answer 202 when a saga takes longer")
      ->capture_default_str();
  cmd->add_option("--otlp-endpoint", o.otlp_endpoint,
                  "send spans to this OTLP/HTTP endpoint instead of storing them here");
  AddOtlpHeaderOption(cmd, flags.otlp_headers);
  cmd->add_option("--participant-timeout-ms", o.participant_timeout,
                  "read timeout of one participant call")
      ->capture_default_str();
  cmd->add_option("--participant-max-in-flight", o.participant_max_in_flight,
                  "calls in flight to each participant at most; a saga past it waits, parked "
                  "(0: no limit)")
      ->capture_default_str();
  cmd->add_option("--tenant-running-limit", o.sagas.tenant_running_limit,
                  "sagas of one tenant running at once in this process at most; more wait, "
                  "queued (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--http-threads", o.limits.threads,
                  "HTTP workers: requests handled at once (a saga's wait holds none)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  cmd->add_option("--saga-threads", o.sagas.threads,
                  "sagas running at once on the saga pool (past --inline-limit, and resumed "
                  "ones); more wait, queued")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--inline-limit", o.sagas.inline_limit,
                  "sagas run on their requests' own HTTP workers at most (below "
                  "--http-threads); the rest run on the saga pool")
      ->capture_default_str();
  cmd->add_option("--park-after-ms", o.retry.park_after,
                  "a wait this long or longer holds no thread: the saga is parked and resumed "
                  "when due (0: never park)")
      ->capture_default_str();
  cmd->add_option("--payment-confirmation-timeout-ms", flags.place_order.confirmation_timeout,
                  "how long an order paid by a card that needs 3-D Secure waits for "
                  "payment_confirmed before it releases the stock and voids the charge")
      ->capture_default_str();
  cmd->add_option("--sweep-interval-ms", o.recovery.sweep_interval,
                  "how often recovery looks for expired leases")
      ->capture_default_str();
  cmd->add_option("--stuck-retry-ms", o.retry.stuck_retry_interval,
                  "pace of retries for a stuck compensation")
      ->capture_default_str();
  cmd->add_option("--retention-hours", flags.retention_hours,
                  "how long finished keys are kept, counted from the end of their saga")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  cmd->add_option("--reconcile-interval-ms", o.reconcile_interval,
                  "how often to reconcile sagas with the participants' keys (0: never)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--reconcile-since",
         [&o](const std::string& v) { o.reconcile_since = *orchestrator::ParseDuration(v); },
         "the window each reconciliation checks, e.g. 1h (default)")
      ->check(CheckDuration);
  cmd->add_option("--shutdown-grace-ms", flags.grace,
                  "on SIGTERM, how long running sagas may finish")
      ->capture_default_str();
  cmd->add_option("--amqp-url", flags.amqp.url,
                  "also take orders and events from RabbitMQ: "
                  "amqp://user:password@host:port/vhost")
      ->envname("IDEMSAGA_AMQP_URL");
  cmd->add_option("--amqp-queue", flags.amqp.queue,
                  "the queue orders come from (refused ones go to QUEUE.dead)")
      ->capture_default_str();
  cmd->add_option("--amqp-events-queue", flags.amqp_events_queue,
                  "the queue external events for waiting runs come from (default: the "
                  "--amqp-queue name + .events; refused ones go to EVENTS_QUEUE.dead)");
  cmd->add_option("--amqp-consumers", flags.amqp.consumers,
                  "connections consuming each queue, each with one message in hand at a time")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--amqp-max-wait-ms", flags.amqp.max_wait,
                  "how long a message waits for its saga before going back to the queue")
      ->capture_default_str();
  cmd->callback([flags_ptr, &run] {
    // A worker must stay free for reads, polls and health checks whatever the sagas do.
    if (flags_ptr->options.sagas.inline_limit >= flags_ptr->options.limits.threads) {
      throw CLI::ValidationError("--inline-limit", "must be below --http-threads");
    }
    run = [flags_ptr] {
      auto& flags = *flags_ptr;
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.options.database_url));
        common::pg::Migrate(conn, "orchestrator");
      }
      auto [host, port] = common::SplitHostPort(flags.listen);
      flags.options.store.retention = std::chrono::hours(flags.retention_hours);
      flags.options.otlp_headers = ParseHeaders(flags.otlp_headers);
      for (const auto& p : flags.participants) {
        auto eq = p.find('=');
        flags.options.participants[p.substr(0, eq)].base_url = p.substr(eq + 1);
      }
      orchestrator::Orchestrator o(flags.options, steps::ShippedSagas(flags.place_order));
      o.CheckParticipantRetention();
      int bound = o.Bind(host, port);
      std::thread server([&] { o.Serve(); });
      std::optional<orchestrator::amqp::Intake> intake, events;
      if (!flags.amqp.url.empty()) {
        intake.emplace(
            flags.amqp,
            [&o](const httplib::Request& req, httplib::Response& res) {
              return o.SubmitOrder(req, res);
            },
            &o.metrics());
        auto events_options = flags.amqp;
        events_options.carries = orchestrator::amqp::Carries::kEvents;
        events_options.queue = flags.amqp_events_queue.empty() ? flags.amqp.queue + ".events"
                                                               : flags.amqp_events_queue;
        events.emplace(
            events_options,
            [&o](const httplib::Request& req, httplib::Response& res) {
              return o.DeliverEvent(req, res);
            },
            &o.metrics());
        intake->Start();
        events->Start();
      }
      std::cout << "orchestrator ready on http://" << host << ":" << bound << std::endl;
      idemsaga_cmd::WaitForStopSignal();
      // The queues first: a message whose answer is not final yet goes back to its queue.
      if (events) events->Stop();
      if (intake) intake->Stop();
      o.Shutdown(flags.grace);
      server.join();
    };
  });
}

}  // namespace idemsaga_cmd
