// `idemsaga tenant place` and `idemsaga tenant move`: tenants on several PostgreSQL clusters
// (docs/operations.md, "Tenants on several clusters").
#include <iostream>
#include <memory>
#include <pqxx/pqxx>

#include "app/commands.hpp"
#include "app/tenant_move.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/url.hpp"
#include "common/placement.hpp"
#include "orchestrator/reconcile.hpp"

namespace idemsaga::app {
namespace {

// A tenant's first placement; one placed already stays where it is (`tenant move` moves it).
constexpr const char* kPlace = R"sql(
  INSERT INTO tenant_placement (tenant_id, cluster) VALUES ($1, $2)
  ON CONFLICT (tenant_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id
  RETURNING cluster)sql";

struct PlacementFlags {
  std::string tenant;
  std::string directory_url;
  std::string cluster;
  std::vector<std::string> from, to;
  std::string drain_timeout = "60s";
};

}  // namespace

void AddTenantPlacementCommands(CLI::App* tenant, Run& run) {
  auto flags_ptr = std::make_shared<PlacementFlags>();
  auto& flags = *flags_ptr;
  auto* place = tenant->add_subcommand(
      "place", "Place a tenant on a PostgreSQL cluster (tenants on several clusters)");
  auto* move = tenant->add_subcommand(
      "move",
      "Move a tenant to another cluster: drain, copy its rows, switch, delete the old rows");
  for (auto* cmd : {place, move}) {
    cmd->add_option("name", flags.tenant, "tenant id: 1-64 of [A-Za-z0-9_-]")->required();
    cmd->add_option("--placement-url", flags.directory_url,
                    "postgresql:// URL of the directory database (tenant_placement)")
        ->envname("IDEMSAGA_PLACEMENT_URL")
        ->required();
  }
  place->add_option("--cluster", flags.cluster, "the cluster's name: 1-64 of [a-z0-9_-]")
      ->required();
  move->add_option("--to", flags.cluster, "the target cluster's name")->required();
  move->add_option("--from-database", flags.from,
                   "a database of the tenant on its cluster now: the orchestrator's and each "
                   "participant's (repeatable)")
      ->required();
  move->add_option("--to-database", flags.to,
                   "the same database on the target cluster, in the order of --from-database "
                   "(repeatable; migrated)")
      ->required();
  move->add_option("--drain-timeout", flags.drain_timeout,
                   "how long the tenant's running sagas may take to finish before the move is "
                   "called off")
      ->check(CheckDuration)
      ->capture_default_str();
  auto check = [flags_ptr] {
    if (!common::IsValidTenantId(flags_ptr->tenant)) {
      throw CLI::ValidationError("name", "must be 1-64 of [A-Za-z0-9_-]");
    }
    if (!common::IsValidClusterName(flags_ptr->cluster)) {
      throw CLI::ValidationError("cluster", "must be 1-64 of [a-z0-9_-]");
    }
  };
  place->callback([flags_ptr, check, &run] {
    check();
    run = [flags_ptr] {
      auto& f = *flags_ptr;
      pqxx::connection conn(common::pg::WithSessionTimeouts(f.directory_url));
      pqxx::work tx(conn);
      auto where = tx.exec_params1(kPlace, f.tenant, f.cluster)[0].as<std::string>();
      tx.commit();
      if (where != f.cluster) {
        std::cerr << "tenant " << f.tenant << " is on " << where
                  << " already; `idemsaga tenant move` moves it" << std::endl;
        SetExitCode(1);
        return;
      }
      std::cout << "tenant " << f.tenant << " placed on " << f.cluster << std::endl;
    };
  });
  move->callback([flags_ptr, check, &run] {
    check();
    if (flags_ptr->from.size() != flags_ptr->to.size()) {
      throw CLI::ValidationError("--to-database", "give one for each --from-database");
    }
    run = [flags_ptr] {
      auto& f = *flags_ptr;
      TenantMoveOptions options{
          .tenant = f.tenant,
          .to = f.cluster,
          .directory_url = f.directory_url,
          .drain_timeout = *orchestrator::ParseDuration(f.drain_timeout),
          .progress = [](const std::string& line) { std::cout << "move: " << line << std::endl; }};
      for (size_t i = 0; i < f.from.size(); ++i) options.databases.emplace_back(f.from[i], f.to[i]);
      try {
        auto report = TenantMove(options).Run();
        std::cout << "moved tenant " << f.tenant << " from " << report.from << " to " << f.cluster
                  << ": rows_copied=" << report.rows_copied
                  << " rows_deleted=" << report.rows_deleted
                  << " drained_ms=" << report.drained.count()
                  << " frozen_ms=" << report.frozen.count() << std::endl;
      } catch (const std::runtime_error& e) {
        std::cerr << "tenant move: " << e.what() << std::endl;
        SetExitCode(1);
      }
    };
  });
}

}  // namespace idemsaga::app
