// Guard::ListKeys (what a reconciler reads), Guard::DeleteExpired (garbage collection) and
// Guard::Ready.
#include <algorithm>
#include <stdexcept>

#include "steps/guard/guard.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;

std::vector<protocol::KeyRecord> Guard::ListKeys(const std::string& tenant_id,
                                                 std::chrono::seconds since,
                                                 const std::string& after, int limit) {
  auto retention = std::chrono::duration_cast<std::chrono::seconds>(options_.retention);
  since = std::min(since, retention);
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    std::vector<protocol::KeyRecord> out;
    for (const auto& r :
         Exec(tx, detail::kListKeys, tenant_id, static_cast<double>(retention.count()),
              static_cast<double>(since.count()), after, limit)) {
      auto name = r[1].as<std::string>();
      auto status = protocol::ParseKeyStatus(name);
      if (!status) throw std::runtime_error("idempotency_keys holds a key status '" + name + "'");
      out.push_back(
          {r[0].as<std::string>(), *status, r[2].as<int>(), r[3].as<bool>(), r[4].as<double>()});
    }
    return out;
  });
}

long long Guard::DeleteExpired(int batch) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::work tx(conn);
    auto r = Exec(tx, detail::kDeleteExpired, batch);
    tx.commit();
    return static_cast<long long>(r.affected_rows());
  });
}

bool Guard::Ready() { return common::pg::Reachable(pool_); }

}  // namespace idemsaga::steps::guard
