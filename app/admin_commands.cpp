#include <algorithm>
#include <iostream>
#include <memory>

#include "app/app.hpp"
#include "app/commands.hpp"
#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/cluster.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/pool.hpp"
#include "common/pg/url.hpp"
#include "orchestrator/reconcile.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::app {
namespace {

struct MigrateFlags {
  std::string database_url;
  std::string kind;
  std::string server_url;
};

void AddMigrateCommand(CLI::App& app, Run& run) {
  auto flags_ptr = std::make_shared<MigrateFlags>();
  auto& flags = *flags_ptr;
  auto* cmd = app.add_subcommand(
      "migrate", "Apply pending migrations to one database, or create and migrate all of them");
  cmd->add_option("--database-url", flags.database_url, "the database to migrate");
  auto kinds = common::pg::DatabaseKinds();
  kinds.push_back("directory");  // tenants on several clusters: where each one is
  cmd->add_option("--kind", flags.kind, "what that database is for")->check(CLI::IsMember(kinds));
  cmd->add_option(
      "--server-url", flags.server_url,
      "instead: create idemsaga_orchestrator, _inventory, _payment and _shipping on this "
      "server if missing, and migrate each");
  cmd->callback([flags_ptr, &run] {
    run = [flags_ptr] {
      auto& flags = *flags_ptr;
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

struct TenantFlags {
  std::string name;
  std::string database_url;
};

void AddTenantCommand(CLI::App& app, Run& run) {
  auto flags_ptr = std::make_shared<TenantFlags>();
  auto& flags = *flags_ptr;
  auto* tenant = app.add_subcommand("tenant", "Manage tenants");
  tenant->require_subcommand(1);
  auto* create = tenant->add_subcommand("create", "Create a tenant (or give it a new API key)");
  auto* list = tenant->add_subcommand("list", "List the tenants");
  auto* revoke = tenant->add_subcommand(
      "revoke",
      "Revoke a tenant's API key: its runs stay readable to operators, no request of "
      "it is taken (within the orchestrators' tenant cache, 30 s)");
  AddTenantPlacementCommands(tenant, run);
  for (auto* cmd : {create, list, revoke}) {
    cmd->add_option("--database-url", flags.database_url, "the orchestrator's database")
        ->envname("IDEMSAGA_DATABASE_URL")
        ->required();
  }
  for (auto* cmd : {create, revoke}) {
    cmd->add_option("name", flags.name, "tenant id: 1-64 of [A-Za-z0-9_-]")->required();
  }
  // The tenant store of `flags`, for one command.
  auto with_store = [flags_ptr](const std::function<void(orchestrator::store::ParentStore&)>& f) {
    common::pg::Pool pool({.url = flags_ptr->database_url, .size = 1});
    orchestrator::store::ParentStore store(pool, {});
    f(store);
  };
  create->callback([flags_ptr, with_store, &run] {
    run = [flags_ptr, with_store] {
      auto& flags = *flags_ptr;
      if (!common::IsValidTenantId(flags.name)) {
        throw CLI::ValidationError("name", "must be 1-64 of [A-Za-z0-9_-]");
      }
      with_store([&](orchestrator::store::ParentStore& store) {
        std::string api_key = "isk_" + common::RandomHex(32);
        store.UpsertTenant(flags.name, common::Sha256Hex(api_key));
        std::cout << "tenant " << flags.name << " API key (shown once, store it now):\n"
                  << api_key << std::endl;
      });
    };
  });
  list->callback([with_store, &run] {
    run = [with_store] {
      with_store([](orchestrator::store::ParentStore& store) {
        for (const auto& id : store.TenantIds()) std::cout << id << "\n";
      });
    };
  });
  revoke->callback([flags_ptr, with_store, &run] {
    run = [flags_ptr, with_store] {
      with_store([&](orchestrator::store::ParentStore& store) {
        auto ids = store.TenantIds();
        if (std::find(ids.begin(), ids.end(), flags_ptr->name) == ids.end()) {
          std::cerr << "no tenant " << flags_ptr->name << std::endl;
          SetExitCode(1);
          return;
        }
        // The rows stay (every key and saga refers to its tenant); the key becomes one nobody
        // holds. `tenant create` gives it a new one.
        store.UpsertTenant(flags_ptr->name, common::Sha256Hex(common::RandomHex(32)));
        std::cout << "tenant " << flags_ptr->name << ": API key revoked" << std::endl;
      });
    };
  });
}

struct ReconcileFlags {
  std::string database_url;
  std::vector<std::string> participants;
  std::string service_token;  // the binary's default, if it has one (App::Impl)
  std::string since = "1h";
  std::string format = "text";
  int retention_hours = 24;
};

// Exit codes: 0 all agree, 1 a discrepancy, 2 a participant or row could not be read.
void AddReconcileCommand(CLI::App& app, Run& run, const idemsaga::App::Impl& setup) {
  auto flags_ptr = std::make_shared<ReconcileFlags>();
  auto& flags = *flags_ptr;
  auto* cmd = app.add_subcommand(
      "reconcile",
      "Check finished sagas against every participant's keys; exit 1 on a discrepancy");
  cmd->add_option("--database-url", flags.database_url, "the orchestrator's database")
      ->envname("IDEMSAGA_DATABASE_URL")
      ->required();
  cmd->add_option("--participant", flags.participants,
                  "NAME=URL of a participant to ask (repeatable; default: every declared "
                  "participant with a URL)")
      ->envname("IDEMSAGA_PARTICIPANTS")
      ->delimiter(',')
      ->check(CheckParticipantFlag);
  cmd->add_option("--service-token", flags.service_token, "token presented to participants")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cmd->add_option("--since", flags.since, "the window: sagas created this long ago at most")
      ->check(CheckDuration)
      ->capture_default_str();
  cmd->add_option("--format", flags.format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  cmd->add_option("--retention-hours", flags.retention_hours,
                  "the orchestrator's key retention (the window is clamped to it)")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  flags.service_token = setup.default_service_token;
  cmd->callback([flags_ptr, &run, &setup] {
    // As the orchestrator command: a team's binary has no token to fall back on.
    if (flags_ptr->service_token.empty()) {
      throw CLI::RequiredError("--service-token (or IDEMSAGA_SERVICE_TOKEN)");
    }
    run = [flags_ptr, &setup] {
      auto& flags = *flags_ptr;
      std::map<std::string, orchestrator::ReconcileParticipant> participants;
      if (flags.participants.empty()) {
        for (const auto& [name, p] : setup.participants) {
          if (!p.url.empty()) participants[name] = {p.url, flags.service_token};
        }
      }
      for (const auto& p : flags.participants) {
        auto eq = p.find('=');
        participants[p.substr(0, eq)] = {p.substr(eq + 1), flags.service_token};
      }
      common::pg::Pool pool({.url = flags.database_url, .size = 1});
      orchestrator::store::ParentStore store(
          pool, {.retention = std::chrono::hours(flags.retention_hours)});
      auto report = orchestrator::Reconciler(store, participants,
                                             {.since = *orchestrator::ParseDuration(flags.since)})
                        .Run();
      std::cout << (flags.format == "json" ? report.ToJson().dump(2) + "\n" : report.ToText());
      SetExitCode(!report.errors.empty() ? 2 : report.discrepancies_found == 0 ? 0 : 1);
    };
  });
}

}  // namespace

void AddAdminCommands(CLI::App& app, Run& run, const idemsaga::App::Impl& setup) {
  AddMigrateCommand(app, run);
  AddTenantCommand(app, run);
  AddReconcileCommand(app, run, setup);
}

}  // namespace idemsaga::app
