#include "orchestrator/tenant_auth.hpp"

#include "common/crypto.hpp"

namespace idemsaga::orchestrator {

std::optional<std::string> TenantAuth::operator()(const std::string& token) {
  return Placed(Lookup(token));
}

std::optional<std::string> TenantAuth::Cached(const std::string& token) {
  if (token.empty() || token.size() > 256) return std::nullopt;
  return Placed(FromCache(common::Sha256Hex(token)));
}

std::optional<std::string> TenantAuth::Placed(std::optional<std::string> tenant) {
  if (tenant && placement_ != nullptr) {
    placement_->Require(*tenant, common::pg::Placement::Role::kIntake);
  }
  return tenant;
}

std::optional<std::string> TenantAuth::FromCache(const std::string& hash) {
  std::lock_guard lock(mutex_);
  auto it = cache_.find(hash);
  if (it != cache_.end() && it->second.second > std::chrono::steady_clock::now()) {
    return it->second.first;
  }
  return std::nullopt;
}

std::optional<std::string> TenantAuth::Lookup(const std::string& token) {
  if (token.empty() || token.size() > 256) return std::nullopt;
  std::string hash = common::Sha256Hex(token);
  if (auto cached = FromCache(hash)) return cached;
  // Cached so that an order costs no extra transaction for authentication.
  auto tenant = store_.TenantForKeyHash(hash);
  if (tenant) {
    std::lock_guard lock(mutex_);
    if (cache_.size() > 10000) cache_.clear();
    cache_[hash] = {*tenant, std::chrono::steady_clock::now() + ttl_};
  }
  return tenant;
}

}  // namespace idemsaga::orchestrator
