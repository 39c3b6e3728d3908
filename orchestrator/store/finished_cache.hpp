// Finished answers kept in memory, so that a retry storm of finished keys is answered without
// a database round trip. Filled by replays, not by finishing: most keys are never sent again.
//
// A finished parent row never changes again (Finish only moves a running saga), so a cached
// copy is the stored answer, on every replica. An entry lives at most `ttl`, and never past the
// row's own expiry (after which the key may be claimed afresh). Bounded by bytes; the least
// recently used entries go first. Thread-safe.
//   FinishedCache cache({.max_bytes = 4 << 20});
//   cache.Put(tenant, key, answer, row_expires_in);  auto hit = cache.Get(tenant, key);
#pragma once

#include <chrono>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace idemsaga::orchestrator::store {

// A finished run's stored answer with whose it is (the request's fingerprint, its trace): a
// replay must match the request before it answers. The answer's headers as stored, Content-Type
// among them (common::http::StoredAnswer reads it as an Answer).
struct FinishedAnswer {
  std::string request_hash;
  int status = 0;
  std::string body;
  std::string trace_id;
  std::string root_span_id;
  std::map<std::string, std::string> headers;  // stored with the answer (Location, ...)
};

class FinishedCache {
 public:
  struct Options {
    size_t max_bytes = size_t{4} << 20;  // ~6,000 answers; 0: off
    std::chrono::seconds ttl{60};
  };

  explicit FinishedCache(Options options) : options_(options) {}

  // `row_expires_in`: how long the row itself is kept from now.
  void Put(const std::string& tenant_id, const std::string& key, FinishedAnswer answer,
           std::chrono::milliseconds row_expires_in);
  std::optional<FinishedAnswer> Get(const std::string& tenant_id, const std::string& key);

  size_t bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string id;
    FinishedAnswer answer;
    Clock::time_point expires;
    size_t bytes;
  };
  static std::string Id(const std::string& tenant_id, const std::string& key);
  void EraseLocked(std::list<Entry>::iterator it);

  const Options options_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace idemsaga::orchestrator::store
