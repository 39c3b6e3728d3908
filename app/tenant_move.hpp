// Moving one tenant to another PostgreSQL cluster (docs/operations.md, "Moving a tenant"):
// drain, copy, switch, clean up, with the directory's tenant_placement row as the only switch
// (common/placement.hpp). Every step is safe to run again: a move that stopped half-way is
// taken up by running the same command again.
//
//   1. draining: the source cluster's orchestrator takes no new request of the tenant (503 +
//      Retry-After); its running sagas finish, their participants still serving them. Wait
//      until no saga or pending step of the tenant runs in any source database.
//   2. frozen: nothing serves the tenant. Every row of it (each table with a tenant_id column,
//      the orchestrator's spans of its traces) is copied to the target databases and the copy
//      is compared with the source, table by table.
//   3. active on the target: one UPDATE of the placement row. Then the source's rows of the
//      tenant are deleted (its credentials row stays, so a stale client is told where to go).
// Each change of state is relied on only kPlacementSettle after it: by then every service has
// read it, or refuses every tenant.
//
// Not thread-safe; one move of a tenant at a time (the placement row's conditional updates
// refuse a second mover).
//   TenantMove move({.tenant = "acme", .to = "c2", .directory_url = dir, .databases = pairs});
//   TenantMoveReport report = move.Run();  // std::runtime_error: nothing switched
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace idemsaga::app {

struct TenantMoveOptions {
  std::string tenant;
  std::string to;             // the target cluster's name
  std::string directory_url;  // the directory database (tenant_placement)
  // Each of the tenant's databases: (source URL, target URL), the orchestrator's and every
  // participant's.
  std::vector<std::pair<std::string, std::string>> databases;
  // How long running sagas may take to finish; past it the move is called off (the tenant is
  // active again where it was).
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(60)};
  std::function<void(const std::string&)> progress;  // one line per step (may be empty)
};

struct TenantMoveReport {
  std::string from;
  long long rows_copied = 0;  // in every database, the tenant's own rows and its spans
  long long rows_deleted = 0;
  std::chrono::milliseconds drained{0};  // from draining to the last running saga's end
  std::chrono::milliseconds frozen{0};   // from frozen to active on the target
};

class TenantMove {
 public:
  explicit TenantMove(TenantMoveOptions options) : options_(std::move(options)) {}
  // Throws std::runtime_error (saying what state the tenant is left in) when the move cannot
  // be made; the tenant is then served where it was, or the same command resumes it.
  TenantMoveReport Run();

 private:
  void Say(const std::string& line) const;
  // The placement row's (cluster, state, moving_to); std::runtime_error when there is none.
  std::tuple<std::string, std::string, std::string> Where() const;
  // Runs `sql` ($1 the tenant, $2 the target) on the directory; whether it changed the row.
  bool Update(const char* sql) const;
  // Sagas and pending steps of the tenant still running in the source databases.
  long long Running() const;
  // Waits until nothing of the tenant runs in the source databases; false at the timeout.
  bool Drain();

  TenantMoveOptions options_;
};

}  // namespace idemsaga::app
