// Who a caller is: the tenant whose API key is the caller's bearer token, for every way in
// (the HTTP routes, the AMQP intake), cached for `ttl` so that an order costs no query for it.
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

#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator {

class TenantAuth {
 public:
  TenantAuth(store::ParentStore& store, std::chrono::seconds ttl) : store_(store), ttl_(ttl) {}
  // The tenant of the API key `token`; nullopt for none (an empty token included).
  std::optional<std::string> operator()(const std::string& token);

 private:
  store::ParentStore& store_;
  std::chrono::seconds ttl_;
  std::mutex mutex_;
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> cache_;
};

}  // namespace idemsaga::orchestrator
