// Tenants on several PostgreSQL clusters (docs/scaling.md): a cell (one orchestrator and its
// participants) runs on each cluster, and the directory database's tenant_placement table says
// which cluster holds each tenant. Placement is this process's copy of that table, read again
// every `refresh` on a thread of its own, and the one decision every service makes with it:
// may this cluster serve this tenant now.
//
// The copy is trusted for `max_age` from the moment its read began; past that (the directory
// cannot be read) every tenant is refused. That bound is what makes a move safe without
// telling the services: `idemsaga tenant move` waits kPlacementSettle after each change of a
// tenant's state, and by then every service has either read the change or refuses everyone.
// A refusal is common::Misplaced (common/placement.hpp).
//
// Thread-safe.
//   common::pg::Placement placement({.directory_url = url, .cluster = "c1"});
//   placement.Require(tenant, common::pg::Placement::Role::kIntake);  // throws Misplaced
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/periodic.hpp"
#include "common/placement.hpp"

namespace idemsaga::common::pg {

class Placement {
 public:
  struct Options {
    std::string directory_url;  // postgresql:// URL of the directory database
    std::string cluster;        // the cluster this process serves
    std::chrono::milliseconds refresh = kPlacementRefresh;
    std::chrono::milliseconds max_age = kPlacementMaxAge;
  };
  // The orchestrator's intake takes new requests of an active tenant only; a participant also
  // serves a draining one, whose running sagas are finishing.
  enum class Role { kIntake, kParticipant };

  // Reads the placement once (logging a failure: until a read succeeds every tenant is
  // refused) and keeps reading it every `refresh`.
  explicit Placement(Options options);
  // A service's --placement-url and --cluster: null when both are empty (one cluster serves
  // every tenant); std::invalid_argument when only one is given or the name is not a
  // cluster's ([a-z0-9_-], 1..64).
  static std::unique_ptr<Placement> FromFlags(const std::string& directory_url,
                                              const std::string& cluster);
  ~Placement();
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  // Throws Misplaced unless this cluster may serve `tenant` in `role` now.
  void Require(const std::string& tenant, Role role) const;
  // Reads the table now; false (and logged) when it could not.
  bool Refresh();
  const std::string& cluster() const { return options_.cluster; }

 private:
  struct Entry {
    std::string cluster;
    std::string state;
  };
  struct Snapshot {
    std::map<std::string, Entry> tenants;
    std::chrono::steady_clock::time_point read_at;  // when the read began
  };

  Options options_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Snapshot> snapshot_;  // null until the first read succeeds
  std::mutex refresh_mutex_;                  // one read at a time, on `conn_`
  struct Connection;
  std::unique_ptr<Connection> conn_;
  Periodic refresher_;
};

}  // namespace idemsaga::common::pg
