// ParentStore: tenants and their API keys (parent_store.hpp).

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;

const common::pg::Statement kTenants{"SELECT tenant_id FROM tenants ORDER BY tenant_id"};

const common::pg::Statement kTenantForKey{"SELECT tenant_id FROM tenants WHERE api_key_hash = $1"};

const common::pg::Statement kUpsertTenant{R"sql(
  INSERT INTO tenants (tenant_id, api_key_hash) VALUES ($1, $2)
  ON CONFLICT (tenant_id) DO UPDATE SET api_key_hash = EXCLUDED.api_key_hash)sql"};

}  // namespace

std::vector<std::string> ParentStore::TenantIds() {
  return OneStatement([&](pqxx::nontransaction& tx) {
    std::vector<std::string> out;
    for (const auto& r : Exec(tx, kTenants)) out.push_back(r[0].as<std::string>());
    return out;
  });
}

std::optional<std::string> ParentStore::TenantForKeyHash(const std::string& api_key_hash) {
  return OneStatement([&](pqxx::nontransaction& tx) -> std::optional<std::string> {
    auto rows = Exec(tx, kTenantForKey, api_key_hash);
    if (rows.empty()) return std::nullopt;
    return rows[0][0].as<std::string>();
  });
}

void ParentStore::UpsertTenant(const std::string& tenant_id, const std::string& api_key_hash) {
  OneStatement([&](pqxx::nontransaction& tx) { Exec(tx, kUpsertTenant, tenant_id, api_key_hash); });
}

}  // namespace idemsaga::orchestrator::store
