#include "common/pg/placement.hpp"

#include <pqxx/pqxx>
#include <stdexcept>

#include "common/log.hpp"
#include "common/pg/statement.hpp"
#include "common/pg/url.hpp"

namespace idemsaga::common::pg {
namespace {

// The whole table: every service needs every tenant of its cluster, and a tenant's row is a
// few dozen bytes (a hundred thousand tenants are a few MB every half second; past that, read
// only the rows changed since the last read).
const Statement kReadPlacement{"SELECT tenant_id, cluster, state FROM tenant_placement"};

}  // namespace

std::unique_ptr<Placement> Placement::FromFlags(const std::string& directory_url,
                                                const std::string& cluster) {
  if (directory_url.empty() && cluster.empty()) return nullptr;
  if (directory_url.empty() || cluster.empty()) {
    throw std::invalid_argument("--placement-url and --cluster go together");
  }
  if (!IsValidClusterName(cluster)) {
    throw std::invalid_argument("--cluster must be 1-64 of [a-z0-9_-]: " + cluster);
  }
  return std::make_unique<Placement>(Options{.directory_url = directory_url, .cluster = cluster});
}

struct Placement::Connection {
  std::unique_ptr<pqxx::connection> conn;
  bool failing = false;  // the last read failed (logged once, not at every refresh)
};

Placement::Placement(Options options)
    : options_(std::move(options)),
      conn_(std::make_unique<Connection>()),
      refresher_("placement_refresh", options_.refresh, [this] { Refresh(); }) {
  Refresh();
  refresher_.Start();
}

Placement::~Placement() { refresher_.Stop(); }

bool Placement::Refresh() {
  std::lock_guard refreshing(refresh_mutex_);
  auto snapshot = std::make_shared<Snapshot>();
  snapshot->read_at = std::chrono::steady_clock::now();
  try {
    if (!conn_->conn || !conn_->conn->is_open()) {
      conn_->conn = std::make_unique<pqxx::connection>(WithSessionTimeouts(
          options_.directory_url, {.connect_timeout_s = 2, .statement_timeout_ms = 2000}));
    }
    pqxx::read_transaction tx(*conn_->conn);
    for (const auto& row : Exec(tx, kReadPlacement)) {
      snapshot->tenants[row[0].as<std::string>()] = {row[1].as<std::string>(),
                                                     row[2].as<std::string>()};
    }
  } catch (const std::exception& e) {
    conn_->conn.reset();  // a fresh connection next time (libpqxx 6.4 may not reconnect)
    if (!conn_->failing) Log("placement_unreadable", {{"error", e.what()}});
    conn_->failing = true;
    return false;
  }
  if (conn_->failing) {
    Log("placement_readable", {{"tenants", std::to_string(snapshot->tenants.size())}});
  }
  conn_->failing = false;
  std::lock_guard lock(mutex_);
  snapshot_ = std::move(snapshot);
  return true;
}

void Placement::Require(const std::string& tenant, Role role) const {
  std::shared_ptr<const Snapshot> snapshot;
  {
    std::lock_guard lock(mutex_);
    snapshot = snapshot_;
  }
  if (!snapshot || std::chrono::steady_clock::now() - snapshot->read_at > options_.max_age) {
    throw Misplaced("the tenant directory cannot be read, so no tenant is served", "");
  }
  auto it = snapshot->tenants.find(tenant);
  if (it == snapshot->tenants.end()) {
    throw Misplaced("tenant " + tenant + " is placed on no cluster", "");
  }
  const Entry& e = it->second;
  if (e.cluster != options_.cluster) {
    throw Misplaced(
        "tenant " + tenant + " is served by cluster " + e.cluster + ", not " + options_.cluster,
        e.cluster);
  }
  const bool serves = e.state == "active" || (e.state == "draining" && role == Role::kParticipant);
  if (!serves) {
    throw Misplaced("tenant " + tenant + " is moving to another cluster (" + e.state + ")",
                    e.cluster);
  }
}

}  // namespace idemsaga::common::pg
