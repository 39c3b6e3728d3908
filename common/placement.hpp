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
// A refusal is a common::Unavailable: 503 + Retry-After at every edge, nothing stored, and a
// retry with the same key later is safe.
//
// Thread-safe.
//   common::Placement placement({.directory_url = url, .cluster = "c1"});
//   placement.Require(tenant, common::Placement::Role::kIntake);  // throws Misplaced
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/periodic.hpp"
#include "common/unavailable.hpp"

namespace idemsaga::common {

// How long a service trusts its copy of the placement, from the start of its read.
inline constexpr std::chrono::milliseconds kPlacementMaxAge{3000};
// How often a service reads the placement again.
inline constexpr std::chrono::milliseconds kPlacementRefresh{500};
// How long a move waits after changing a tenant's state before relying on it: the oldest copy
// any service may still use is then past kPlacementMaxAge.
inline constexpr std::chrono::milliseconds kPlacementSettle =
    kPlacementMaxAge + kPlacementRefresh + std::chrono::milliseconds(500);

// A tenant this cluster must not serve now; `cluster` is where it is placed ("" if nowhere or
// unknown), for a front that routes by it (the Idemsaga-Tenant-Cluster header).
class Misplaced : public Unavailable {
 public:
  Misplaced(const std::string& what, std::string cluster)
      : Unavailable(what), cluster_(std::move(cluster)) {}
  const std::string& cluster() const { return cluster_; }

 private:
  std::string cluster_;
};

// A cluster's name in tenant_placement: 1..64 of [a-z0-9_-].
bool IsValidClusterName(const std::string& name);

// The response header naming the cluster a refused tenant is placed on.
inline constexpr const char* kTenantClusterHeader = "Idemsaga-Tenant-Cluster";

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

}  // namespace idemsaga::common
