#include "orchestrator/store/finished_cache.hpp"

#include <algorithm>
#include <utility>

namespace idemsaga::orchestrator::store {

std::string FinishedCache::Id(const std::string& tenant_id, const std::string& key) {
  // A tenant id never contains NUL (tenants table CHECK), so the pair is unambiguous.
  std::string id;
  id.reserve(tenant_id.size() + 1 + key.size());
  id.append(tenant_id).push_back('\0');
  id.append(key);
  return id;
}

void FinishedCache::EraseLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->id);
  lru_.erase(it);
}

void FinishedCache::Put(const std::string& tenant_id, const std::string& key, FinishedAnswer answer,
                        std::chrono::milliseconds row_expires_in) {
  auto life = std::min<std::chrono::milliseconds>(options_.ttl, row_expires_in);
  if (options_.max_bytes == 0 || life <= std::chrono::milliseconds(0)) return;
  std::string id = Id(tenant_id, key);
  size_t bytes = 2 * id.size() + answer.request_hash.size() + answer.body.size() +
                 answer.trace_id.size() + answer.root_span_id.size() + 128;
  for (const auto& [name, value] : answer.headers) bytes += name.size() + value.size() + 64;
  if (bytes > options_.max_bytes / 4) return;  // a few huge answers must not evict the rest
  std::lock_guard lock(mutex_);
  // Concurrent first replays each fill the entry: the storm's sample goes on across them.
  const auto now = Clock::now();
  Clock::time_point traced = now;
  long long untraced = 0;
  if (auto found = index_.find(id); found != index_.end()) {
    if (found->second->answer.request_hash == answer.request_hash) {
      traced = found->second->traced;
      untraced = found->second->untraced;
    }
    EraseLocked(found->second);
  }
  lru_.push_front({id, std::move(answer), now + life, bytes, traced, untraced});
  index_.emplace(std::move(id), lru_.begin());
  bytes_ += bytes;
  while (bytes_ > options_.max_bytes) EraseLocked(std::prev(lru_.end()));
}

FinishedCache::Entry* FinishedCache::FindLocked(const std::string& tenant_id,
                                                const std::string& key) {
  auto found = index_.find(Id(tenant_id, key));
  if (found == index_.end()) return nullptr;
  auto it = found->second;
  if (Clock::now() >= it->expires) {
    EraseLocked(it);
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it);
  return &*it;
}

std::optional<FinishedAnswer> FinishedCache::Get(const std::string& tenant_id,
                                                 const std::string& key) {
  std::lock_guard lock(mutex_);
  Entry* e = FindLocked(tenant_id, key);
  if (e == nullptr) return std::nullopt;
  return e->answer;
}

std::optional<FinishedAnswer> FinishedCache::Replay(const std::string& tenant_id,
                                                    const std::string& key,
                                                    const std::string& request_hash,
                                                    ReplaySample& sample) {
  std::lock_guard lock(mutex_);
  Entry* e = FindLocked(tenant_id, key);
  if (e == nullptr || e->answer.request_hash != request_hash) return std::nullopt;
  const auto now = Clock::now();
  sample.trace = now - e->traced >= options_.trace_replays_every;
  if (sample.trace) {
    sample.untraced_before = std::exchange(e->untraced, 0);
    e->traced = now;
  } else {
    sample.untraced_before = 0;
    ++e->untraced;
  }
  return e->answer;
}

size_t FinishedCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace idemsaga::orchestrator::store
