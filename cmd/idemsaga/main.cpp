// idemsaga: one binary for every service and tool.
//   idemsaga dev                      the whole stack on a private PostgreSQL (.idemsaga/)
//   idemsaga orchestrator ...         the coordinator service
//   idemsaga inventory|payment|shipping ...  one demo participant
//   idemsaga migrate ...              apply the embedded SQL migrations
//   idemsaga tenant create NAME       a tenant and its API key (printed once)
//   idemsaga order ... / orders get K submit an order, read a saga
#include <CLI/CLI.hpp>
#include <cctype>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "cmd/idemsaga/client_commands.hpp"
#include "cmd/idemsaga/signals.hpp"
#include "common/crypto.hpp"
#include "common/defaults.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/memory.hpp"
#include "common/periodic.hpp"
#include "common/pg/cluster.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "orchestrator/orchestrator.hpp"
#include "services_mock/service.hpp"

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
  services_mock::FaultSettings faults;
};

// --otlp-header "Name: value", repeatable: exactly what the exporter sends to the collector.
void AddOtlpHeaderOption(CLI::App* cmd, std::vector<std::string>& headers) {
  cmd->add_option("--otlp-header", headers,
                  "\"Name: value\" sent with every span export (repeatable), e.g. the "
                  "collector's credentials; nothing else is sent")
      ->check([](const std::string& h) {
        auto colon = h.find(':');
        return colon == std::string::npos || colon == 0 ? std::string("expected \"Name: value\"")
                                                        : std::string();
      });
}

std::map<std::string, std::string> ParseHeaders(const std::vector<std::string>& headers) {
  std::map<std::string, std::string> out;
  for (const auto& h : headers) {
    auto colon = h.find(':');
    auto value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    out[h.substr(0, colon)] = value;
  }
  return out;
}

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

void AddParticipantCommand(CLI::App& app, ParticipantKind kind, ParticipantFlags& flags,
                           std::function<void()>& run) {
  const std::string name = services_mock::NameOf(kind);
  auto* cmd = app.add_subcommand(name, "Run the demo " + name + " participant");
  flags.listen = DefaultListen(kind);
  std::string upper_name = name;
  for (char& c : upper_name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", flags.database_url, "postgresql:// URL of its database")
      ->envname("IDEMSAGA_" + upper_name + "_DATABASE_URL")
      ->required();
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
  cmd->add_option("--fault-error-rate", flags.faults.error_rate, "share of requests answered 503")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-drop-rate", flags.faults.drop_after_commit_rate,
                  "share of requests committed, then dropped without an answer")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-latency-ms", flags.faults.latency_ms, "delay added to every answer")
      ->check(CLI::Range(0, 600000));
  cmd->callback([&flags, kind, &run] {
    run = [&flags, kind] {
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.database_url));
        common::pg::Migrate(conn, services_mock::NameOf(kind));
      }
      auto [host, port] = common::http::SplitHostPort(flags.listen);
      ParticipantService svc(kind, flags.database_url,
                             {.service_token = flags.service_token,
                              .otlp_endpoint = flags.otlp_endpoint,
                              .otlp_headers = ParseHeaders(flags.otlp_headers),
                              .guard = {.retention = std::chrono::hours(flags.retention_hours)}},
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

struct MigrateFlags {
  std::string database_url;
  std::string kind;
  std::string server_url;
};

void AddMigrateCommand(CLI::App& app, MigrateFlags& flags, std::function<void()>& run) {
  auto* cmd = app.add_subcommand(
      "migrate", "Apply pending migrations to one database, or create and migrate all of them");
  cmd->add_option("--database-url", flags.database_url, "the database to migrate");
  cmd->add_option("--kind", flags.kind, "what that database is for")
      ->check(CLI::IsMember(common::pg::DatabaseKinds()));
  cmd->add_option(
      "--server-url", flags.server_url,
      "instead: create idemsaga_orchestrator, _inventory, _payment and _shipping on this "
      "server if missing, and migrate each");
  cmd->callback([&flags, &run] {
    run = [&flags] {
      std::vector<std::pair<std::string, std::string>> targets;  // kind, url
      if (!flags.server_url.empty()) {
        for (const auto& kind : common::pg::DatabaseKinds()) {
          std::string db = "idemsaga_" + kind;
          common::pg::CreateDatabaseIfMissing(flags.server_url, db);
          targets.emplace_back(kind, common::pg::WithDatabase(flags.server_url, db));
        }
      } else if (!flags.database_url.empty() && !flags.kind.empty()) {
        targets.emplace_back(flags.kind, flags.database_url);
      } else {
        throw CLI::ValidationError("migrate", "give --database-url with --kind, or --server-url");
      }
      for (const auto& [kind, url] : targets) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(url));
        int ran = common::pg::Migrate(conn, kind);
        std::cout << kind << ": applied " << ran << " migration(s)" << std::endl;
      }
    };
  });
}

struct OrchestratorFlags {
  std::string listen = common::defaults::LocalListen(common::defaults::kOrchestratorPort);
  std::vector<std::string> otlp_headers;
  bool migrate = false;
  int retention_hours = 24;
  std::chrono::milliseconds grace{10000};
  std::vector<std::string> participants;  // NAME=URL
  orchestrator::OrchestratorOptions options;
};

// --participant NAME=URL: the base URL of the participant sagas call by NAME.
std::string CheckParticipantFlag(const std::string& value) {
  auto eq = value.find('=');
  if (eq == std::string::npos || !saga::IsValidStepName(value.substr(0, eq)) ||
      value.compare(eq + 1, 7, "http://") != 0) {
    return "expected NAME=http://HOST:PORT with NAME of [a-z0-9_]";
  }
  return "";
}

void AddOrchestratorCommand(CLI::App& app, OrchestratorFlags& flags, std::function<void()>& run) {
  auto* cmd = app.add_subcommand("orchestrator", "Run the coordinator service (order API)");
  auto& o = flags.options;
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", o.database_url, "postgresql:// URL of its database")
      ->envname("IDEMSAGA_DATABASE_URL")
      ->required();
  cmd->add_option("--participant", flags.participants,
                  "NAME=URL: where the participant NAME is (repeatable; defaults: "
                  "inventory=http://127.0.0.1:8081, payment=...:8082; ship_order is served "
                  "only with shipping=URL)")
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
  cmd->add_option("--shutdown-grace-ms", flags.grace,
                  "on SIGTERM, how long running sagas may finish")
      ->capture_default_str();
  cmd->callback([&flags, &run] {
    run = [&flags] {
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.options.database_url));
        common::pg::Migrate(conn, "orchestrator");
      }
      auto [host, port] = common::http::SplitHostPort(flags.listen);
      flags.options.store.retention = std::chrono::hours(flags.retention_hours);
      flags.options.otlp_headers = ParseHeaders(flags.otlp_headers);
      for (const auto& p : flags.participants) {
        auto eq = p.find('=');
        flags.options.participants[p.substr(0, eq)].base_url = p.substr(eq + 1);
      }
      orchestrator::Orchestrator o(flags.options);
      o.CheckParticipantRetention();
      int bound = o.Bind(host, port);
      std::thread server([&] { o.Serve(); });
      std::cout << "orchestrator ready on http://" << host << ":" << bound << std::endl;
      idemsaga_cmd::WaitForStopSignal();
      o.Shutdown(flags.grace);
      server.join();
    };
  });
}

struct TenantFlags {
  std::string name;
  std::string database_url;
};

void AddTenantCommand(CLI::App& app, TenantFlags& flags, std::function<void()>& run) {
  auto* tenant = app.add_subcommand("tenant", "Manage tenants");
  auto* create = tenant->add_subcommand("create", "Create a tenant (or give it a new API key)");
  tenant->require_subcommand(1);
  create->add_option("name", flags.name, "tenant id: 1-64 of [A-Za-z0-9_-]")->required();
  create->add_option("--database-url", flags.database_url, "the orchestrator's database")
      ->envname("IDEMSAGA_DATABASE_URL")
      ->required();
  create->callback([&flags, &run] {
    run = [&flags] {
      if (!common::IsValidTenantId(flags.name)) {
        throw CLI::ValidationError("name", "must be 1-64 of [A-Za-z0-9_-]");
      }
      common::pg::Pool pool({.url = flags.database_url, .size = 1});
      orchestrator::ParentStore store(pool, {});
      std::string api_key = "isk_" + common::RandomHex(32);
      store.UpsertTenant(flags.name, common::Sha256Hex(api_key));
      std::cout << "tenant " << flags.name << " API key (shown once, store it now):\n"
                << api_key << std::endl;
    };
  });
}

struct DevFlags {
  std::string dir = ".idemsaga";
  int pg_port = common::defaults::kPostgresPort;
  int orchestrator_port = common::defaults::kOrchestratorPort;
  int inventory_port = common::defaults::kInventoryPort;
  int payment_port = common::defaults::kPaymentPort;
  int shipping_port = common::defaults::kShippingPort;
};

// Fixed, dev-only API keys so the README's examples work as written. Never use them elsewhere.
constexpr std::pair<const char*, const char*> kDevTenants[] = {{"demo", "dev-key-demo"},
                                                               {"acme", "dev-key-acme"}};

void AddDevCommand(CLI::App& app, DevFlags& flags, std::function<void()>& run) {
  auto* cmd = app.add_subcommand(
      "dev", "Run the whole stack locally on a private PostgreSQL cluster (no Docker)");
  cmd->add_option("--dir", flags.dir, "where the private cluster lives")->capture_default_str();
  cmd->add_option("--pg-port", flags.pg_port, "PostgreSQL port (loopback)")->capture_default_str();
  cmd->add_option("--orchestrator-port", flags.orchestrator_port)->capture_default_str();
  cmd->add_option("--inventory-port", flags.inventory_port)->capture_default_str();
  cmd->add_option("--payment-port", flags.payment_port)->capture_default_str();
  cmd->add_option("--shipping-port", flags.shipping_port)->capture_default_str();
  cmd->callback([&flags, &run] {
    run = [&flags] {
      auto dir =
          common::pg::PrivateCluster::ReachableDir(std::filesystem::absolute(flags.dir) / "pg");
      std::cout << "starting PostgreSQL in " << dir.string() << std::endl;
      auto cluster = common::pg::PrivateCluster::Start({.dir = dir, .port = flags.pg_port});
      std::map<std::string, std::string> urls;
      for (const auto& kind : common::pg::DatabaseKinds()) {
        std::string db = "idemsaga_" + kind;
        common::pg::CreateDatabaseIfMissing(cluster->Url(), db);
        urls[kind] = cluster->Url(db);
        pqxx::connection conn(common::pg::WithSessionTimeouts(urls[kind]));
        common::pg::Migrate(conn, kind);
        std::cout << "  " << kind << " database: " << urls[kind] << std::endl;
      }
      using common::defaults::LocalUrl;
      std::string intake = LocalUrl(flags.orchestrator_port) + "/v1/traces";
      // The orchestrator's own intake takes the service token; a collector never gets it.
      services_mock::ParticipantOptions participant{
          .otlp_endpoint = intake,
          .otlp_headers = {
              {"Authorization", std::string("Bearer ") + common::defaults::kServiceToken}}};
      ParticipantService inventory(ParticipantKind::kInventory, urls["inventory"], participant);
      ParticipantService payment(ParticipantKind::kPayment, urls["payment"], participant);
      ParticipantService shipping(ParticipantKind::kShipping, urls["shipping"], participant);
      inventory.Bind("127.0.0.1", flags.inventory_port);
      payment.Bind("127.0.0.1", flags.payment_port);
      shipping.Bind("127.0.0.1", flags.shipping_port);
      orchestrator::OrchestratorOptions options{.database_url = urls["orchestrator"]};
      options.participants["inventory"].base_url = LocalUrl(flags.inventory_port);
      options.participants["payment"].base_url = LocalUrl(flags.payment_port);
      options.participants["shipping"].base_url = LocalUrl(flags.shipping_port);
      orchestrator::Orchestrator orch(options);
      for (const auto& [tenant, key] : kDevTenants) {
        orch.store().UpsertTenant(tenant, common::Sha256Hex(key));
      }
      orch.Bind("127.0.0.1", flags.orchestrator_port);
      std::thread t1([&] { inventory.Serve(); });
      std::thread t2([&] { payment.Serve(); });
      std::thread t4([&] { shipping.Serve(); });
      auto stop_participants = [&] {
        inventory.Stop();
        payment.Stop();
        shipping.Stop();
        t1.join();
        t2.join();
        t4.join();
      };
      try {
        orch.CheckParticipantRetention();  // before the orchestrator serves or recovers
      } catch (...) {
        stop_participants();
        cluster->Stop();
        throw;
      }
      std::thread t3([&] { orch.Serve(); });
      auto stop_all = [&] {
        orch.Shutdown(std::chrono::seconds(10));
        t3.join();
        stop_participants();
      };
      std::cout << "  tenants (DEV ONLY keys): demo = dev-key-demo, acme = dev-key-acme\n"
                << "  inventory http://127.0.0.1:" << flags.inventory_port
                << ", payment http://127.0.0.1:" << flags.payment_port
                << ", shipping http://127.0.0.1:" << flags.shipping_port
                << " (service token: dev-service-token)\n"
                << "idemsaga dev ready: http://127.0.0.1:" << flags.orchestrator_port
                << " (Ctrl-C stops everything)" << std::endl;
      idemsaga_cmd::WaitForStopSignal();
      stop_all();
      cluster->Stop();
      std::cout << "stopped" << std::endl;
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  common::TuneAllocator();
  idemsaga_cmd::BlockStopSignals();
  CLI::App app{"idemsaga: a saga orchestrator with idempotency keys end to end"};
  app.require_subcommand(1);
  std::function<void()> run;
  ParticipantFlags inventory_flags, payment_flags, shipping_flags;
  MigrateFlags migrate_flags;
  DevFlags dev_flags;
  OrchestratorFlags orchestrator_flags;
  TenantFlags tenant_flags;
  idemsaga_cmd::ClientFlags client_flags;
  AddDevCommand(app, dev_flags, run);
  AddOrchestratorCommand(app, orchestrator_flags, run);
  AddParticipantCommand(app, ParticipantKind::kInventory, inventory_flags, run);
  AddParticipantCommand(app, ParticipantKind::kPayment, payment_flags, run);
  AddParticipantCommand(app, ParticipantKind::kShipping, shipping_flags, run);
  AddMigrateCommand(app, migrate_flags, run);
  AddTenantCommand(app, tenant_flags, run);
  idemsaga_cmd::AddClientCommands(app, client_flags, run);
  try {
    app.parse(argc, argv);
    // Servers give memory back after a burst; a client command ends before the first run.
    common::Periodic trim("return_free_memory", std::chrono::seconds(2), common::ReturnFreeMemory);
    trim.Start();
    if (run) run();
    return idemsaga_cmd::ExitCode();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "idemsaga: " << e.what() << std::endl;
    return 1;
  }
}
