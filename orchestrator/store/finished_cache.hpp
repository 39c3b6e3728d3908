// Finished answers kept in memory, so that a retry storm of finished keys is answered without
// a database round trip. Filled by replays, not by finishing: most keys are never sent again.
// A storm is traced by sample, not in full: Replay says which replay of a key is its traced one
// (ReplaySample), at most one a `trace_replays_every`, so a client resending one key cannot
// make the service write a span row and a log line for every copy. (The untraced tail of an
// entry that leaves the cache is counted in the metrics only.)
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

// Whether a replay answered from the cache is its key's traced one, and how many of the key's
// replays were answered untraced since the one traced before it.
struct ReplaySample {
  bool trace = true;
  long long untraced_before = 0;
};

class FinishedCache {
 public:
  struct Options {
    size_t max_bytes = size_t{4} << 20;  // ~6,000 answers; 0: off
    std::chrono::seconds ttl{60};
    // A key's replays traced at most once in this long (the replay that filled the entry was).
    std::chrono::milliseconds trace_replays_every{1000};
  };

  explicit FinishedCache(Options options) : options_(options) {}

  // `row_expires_in`: how long the row itself is kept from now.
  void Put(const std::string& tenant_id, const std::string& key, FinishedAnswer answer,
           std::chrono::milliseconds row_expires_in);
  std::optional<FinishedAnswer> Get(const std::string& tenant_id, const std::string& key);
  // Get for a replay about to be answered, when its request matches `request_hash`; `sample`
  // says whether to trace it.
  std::optional<FinishedAnswer> Replay(const std::string& tenant_id, const std::string& key,
                                       const std::string& request_hash, ReplaySample& sample);

  size_t bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string id;
    FinishedAnswer answer;
    Clock::time_point expires;
    size_t bytes;
    Clock::time_point traced;  // the last traced replay of the key
    long long untraced = 0;    // replays answered since, untraced
  };
  static std::string Id(const std::string& tenant_id, const std::string& key);
  void EraseLocked(std::list<Entry>::iterator it);
  Entry* FindLocked(const std::string& tenant_id, const std::string& key);

  const Options options_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace idemsaga::orchestrator::store
