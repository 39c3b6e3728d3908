#include <filesystem>
#include <iostream>
#include <memory>

#include "app/commands.hpp"
#include "app/serve_until_signal.hpp"
#include "common/crypto.hpp"
#include "common/defaults.hpp"
#include "common/pg/cluster.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"

namespace idemsaga::cmd {
namespace {

using demo::ParticipantKind;
using demo::ParticipantService;

struct DevFlags {
  std::string dir = ".idemsaga";
  // A server to use instead of a private cluster (scripts/ha points it at HAProxy).
  std::string pg_url;
  int pg_port = common::defaults::kPostgresPort;
  int orchestrator_port = common::defaults::kOrchestratorPort;
  int inventory_port = demo::StackParticipantNamed("inventory").port;
  int payment_port = demo::StackParticipantNamed("payment").port;
  int shipping_port = demo::StackParticipantNamed("shipping").port;
};

// Fixed, dev-only API keys so the examples of the README and docs/ work as written. Never use
// them elsewhere.
constexpr std::pair<const char*, const char*> kDevTenants[] = {{"demo", "dev-key-demo"},
                                                               {"acme", "dev-key-acme"}};

}  // namespace

void AddDevCommand(CLI::App& app, app::Run& run) {
  auto flags_ptr = std::make_shared<DevFlags>();
  auto& flags = *flags_ptr;
  auto* cmd = app.add_subcommand(
      "dev", "Run the whole stack locally on a private PostgreSQL cluster (no Docker)");
  cmd->add_option("--dir", flags.dir, "where the private cluster lives")->capture_default_str();
  cmd->add_option("--pg-port", flags.pg_port, "PostgreSQL port (loopback)")->capture_default_str();
  cmd->add_option("--pg-url", flags.pg_url,
                  "postgresql:// URL of a server to use instead of a private cluster (its "
                  "idemsaga_* databases are created there; scripts/ha gives HAProxy's)");
  cmd->add_option("--orchestrator-port", flags.orchestrator_port,
                  "the orchestrator's HTTP port (order API, traces, pages) (loopback)")
      ->capture_default_str();
  cmd->add_option("--inventory-port", flags.inventory_port,
                  "the inventory participant's HTTP port (loopback)")
      ->capture_default_str();
  cmd->add_option("--payment-port", flags.payment_port,
                  "the payment participant's HTTP port (loopback)")
      ->capture_default_str();
  cmd->add_option("--shipping-port", flags.shipping_port,
                  "the shipping participant's HTTP port (loopback)")
      ->capture_default_str();
  cmd->callback([flags_ptr, &run] {
    run = [flags_ptr] {
      auto& flags = *flags_ptr;
      std::unique_ptr<common::pg::PrivateCluster> cluster;
      std::string server_url = flags.pg_url;
      if (server_url.empty()) {
        auto dir =
            common::pg::PrivateCluster::ReachableDir(std::filesystem::absolute(flags.dir) / "pg");
        std::cout << "starting PostgreSQL in " << dir.string() << std::endl;
        cluster = common::pg::PrivateCluster::Start({.dir = dir, .port = flags.pg_port});
        server_url = cluster->Url();
      }
      std::map<std::string, std::string> urls;
      for (const auto& kind : common::pg::DatabaseKinds()) {
        std::string db = "idemsaga_" + kind;
        common::pg::CreateDatabaseIfMissing(server_url, db);
        urls[kind] = common::pg::WithDatabase(server_url, db);
        pqxx::connection conn(common::pg::WithSessionTimeouts(urls[kind]));
        common::pg::Migrate(conn, kind);
        std::cout << "  " << kind << " database: " << urls[kind] << std::endl;
      }
      using common::defaults::LocalUrl;
      std::string intake = LocalUrl(flags.orchestrator_port) + "/v1/traces";
      // The orchestrator's own intake takes the service token; a collector never gets it.
      demo::ParticipantOptions participant{
          .otlp_endpoint = intake,
          .otlp_headers = {{"Authorization", std::string("Bearer ") + demo::kServiceToken}}};
      ParticipantService inventory(ParticipantKind::kInventory, urls["inventory"], participant);
      ParticipantService payment(ParticipantKind::kPayment, urls["payment"], participant);
      ParticipantService shipping(ParticipantKind::kShipping, urls["shipping"], participant);
      inventory.Bind("127.0.0.1", flags.inventory_port);
      payment.Bind("127.0.0.1", flags.payment_port);
      shipping.Bind("127.0.0.1", flags.shipping_port);
      orchestrator::OrchestratorOptions options{.database_url = urls["orchestrator"],
                                                .service_token = demo::kServiceToken};
      const std::map<std::string, int> ports = {{"inventory", flags.inventory_port},
                                                {"payment", flags.payment_port},
                                                {"shipping", flags.shipping_port}};
      for (const auto& p : demo::kStackParticipants) {
        options.participants[p.name] = {.base_url = LocalUrl(ports.at(p.name)),
                                        .business_errors = p.business_errors};
      }
      orchestrator::Orchestrator orch(options);
      for (const auto& [tenant, key] : kDevTenants) {
        orch.store().UpsertTenant(tenant, common::Sha256Hex(key));
      }
      orch.Bind("127.0.0.1", flags.orchestrator_port);
      app::ServeUntilSignal serving("dev");
      serving.Add([&] { inventory.Serve(); }, [&] { inventory.Stop(); });
      serving.Add([&] { payment.Serve(); }, [&] { payment.Stop(); });
      serving.Add([&] { shipping.Serve(); }, [&] { shipping.Stop(); });
      try {
        orch.CheckParticipantRetention();  // before the orchestrator serves or recovers
      } catch (...) {
        serving.Stop();
        if (cluster) cluster->Stop();
        throw;
      }
      // Stopped first (reverse order): the orchestrator drains while its participants serve.
      serving.Add([&] { orch.Serve(); }, [&] { orch.Shutdown(std::chrono::seconds(10)); });
      // A Ctrl-C that reaches only the cluster (it leads a process group of its own) must not
      // leave the stack running without its database.
      std::string ready =
          "  tenants (DEV ONLY keys): demo = dev-key-demo, acme = dev-key-acme\n"
          "  inventory http://127.0.0.1:" +
          std::to_string(flags.inventory_port) +
          ", payment http://127.0.0.1:" + std::to_string(flags.payment_port) +
          ", shipping http://127.0.0.1:" + std::to_string(flags.shipping_port) +
          " (service token: " + demo::kServiceToken +
          ")\n"
          "idemsaga dev ready: http://127.0.0.1:" +
          std::to_string(flags.orchestrator_port) + " (Ctrl-C stops everything)";
      // A server of someone else's (--pg-url) may restart or fail over: the pool rides it out.
      if (serving.Wait(ready, [&] { return !cluster || cluster->ServerRunning(); }) == 0) {
        std::cerr << "the dev PostgreSQL cluster has stopped: stopping everything" << std::endl;
      }
      serving.Stop();
      if (cluster) cluster->Stop();
      std::cout << "stopped" << std::endl;
    };
  });
}

}  // namespace idemsaga::cmd
