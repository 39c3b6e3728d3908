// Tenants on several PostgreSQL clusters (docs/scaling.md): what every edge needs to know of a
// tenant placed elsewhere. The directory's reader is common/pg/placement.hpp.
//
// A refusal is a common::Unavailable: 503 + Retry-After at every edge, nothing stored, and a
// retry with the same key later is safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

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
inline bool IsValidClusterName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// The response header naming the cluster a refused tenant is placed on.
inline constexpr const char* kTenantClusterHeader = "Idemsaga-Tenant-Cluster";

}  // namespace idemsaga::common
