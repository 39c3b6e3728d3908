// Who a caller is: the tenant whose API key is the caller's bearer token, for every way in
// (the HTTP routes, the AMQP intake), cached for `ttl` so that an order costs no query for it.
// With a placement (tenants on several clusters), a tenant this cluster does not serve now
// is refused with common::Misplaced (503 + Retry-After at every edge) before anything is read
// or stored for it.
//
// Thread-safe.
//   TenantAuth auth(store, std::chrono::seconds(30));
//   std::optional<std::string> tenant = auth(common::BearerTokenOf(authorization));
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/pg/placement.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator {

class TenantAuth {
 public:
  TenantAuth(store::ParentStore& store, std::chrono::seconds ttl,
             const common::pg::Placement* placement = nullptr)
      : store_(store), ttl_(ttl), placement_(placement) {}
  // The tenant of the API key `token`; nullopt for none (an empty token included). Throws
  // common::Misplaced for a tenant that is not to be served here now.
  std::optional<std::string> operator()(const std::string& token);
  // The same from memory only: nullopt also when the token is not cached (never blocks).
  std::optional<std::string> Cached(const std::string& token);

 private:
  std::optional<std::string> Lookup(const std::string& token);
  std::optional<std::string> FromCache(const std::string& hash);
  std::optional<std::string> Placed(std::optional<std::string> tenant);

  store::ParentStore& store_;
  std::chrono::seconds ttl_;
  const common::pg::Placement* placement_;
  std::mutex mutex_;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> cache_;
};

}  // namespace idemsaga::orchestrator
