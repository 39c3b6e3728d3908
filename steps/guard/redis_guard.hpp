// The participant guard's key store on Redis: the promise of Guard::RunExternal and
// Guard::CompensateExternal (guard.hpp) kept in Redis instead of PostgreSQL, for a participant
// whose effect is elsewhere (a partner's API, a card network) and that keeps no database.
//
// The same protocol as the PostgreSQL guard, from the same tables (participant_protocol.hpp):
// a key is claimed as pending under a lease and a fencing token by one script, the call goes
// out with no script running, and a second script records the answer only if the token is
// still the caller's. A retry replays the stored answer byte for byte (headers too), the same
// key with another body is refused 422, a duplicate in flight 409 + Retry-After, and a claim
// whose lease ran out is taken over and its effect told earlier_attempt. A compensation undoes
// its action once, or, arriving first, leaves a tombstone that refuses the late action. The
// scripts decide and return names (an Outcome's, a Refusal's); every answer is worded in C++
// by Refuse and CompensationBody, so no message is restated in Lua.
//
// An effect inside Redis (a store of the caller's own whose effect is one script: the demo
// inventory) reuses the same record and its rules: kLuaPrelude's functions in its scripts,
// AnswerOf for their replies, RecordKey and IndexKey for the keys, ListKeys for the listing.
//
// Redis layout (the URL's db): idem:<tenant>:<key> a hash {status, hash, rs, ct, body, hd,
// comp, t, lease, tok}; idem-index:<tenant> a sorted set of keys by write time (the
// reconciler's listing). A key expires GuardOptions::retention after its claim (a
// compensation restarts an action's clock; a key read past half its life is kept a full
// retention again), as the orchestrator's start-up check expects. Needs Redis 7 (script flags).
//
// Thread-safe.
//   steps::guard::RedisGuard g(redis, {.retention = std::chrono::hours(168)});
//   g.CheckServer(RedisFsync::kEverysec);
//   auto res = g.RunExternal(req, [&](const ExternalCall& call) { return SendEmail(call); });
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/redis/pool.hpp"
#include "steps/guard/guard.hpp"

namespace idemsaga::steps::guard {

// The persistence a Redis key store requires of its server at start-up.
enum class RedisFsync {
  // appendonly yes and appendfsync everysec (or always): a crash of Redis' host may lose up
  // to about a second of acknowledged writes (docs/participants.md, "Keys in Redis").
  kEverysec,
  // appendfsync always: every acknowledged write is on disk.
  kAlways,
  // Not checked (CONFIG is disabled, as on some managed Redis): the operator vouches.
  kUnchecked,
};
// "everysec", "always" or "unchecked"; nullopt for anything else.
std::optional<RedisFsync> ParseRedisFsync(std::string_view name);

class RedisGuard : public KeyStore {
 public:
  // Uses `options.lease` and `options.retention` (Duplicates does not apply: a duplicate in
  // flight always gets 409 at once).
  RedisGuard(common::redis::Pool& redis, GuardOptions options);

  // Throws std::runtime_error (naming the setting to change) when the server would lose keys
  // beyond what `fsync` accepts, or could evict them (a maxmemory policy other than
  // noeviction); common::redis::Unavailable when it cannot be reached.
  void CheckServer(RedisFsync fsync);
  // True when Redis answers PING.
  bool Ready() override;

  // As Guard::RunExternal and Guard::CompensateExternal (guard.hpp); a Redis outage throws
  // common::redis::Unavailable (nothing known to have happened: retry with the key).
  Response RunExternal(const Request& req, const ExternalEffect& effect) override;
  Response CompensateExternal(const Request& req, const std::string& action_key,
                              const ExternalUndo& undo, bool action_applied = false) override;

  // As Guard::ListKeys.
  std::vector<protocol::KeyRecord> ListKeys(const std::string& tenant_id,
                                            std::chrono::seconds since, const std::string& after,
                                            int limit) override;
  // 0: Redis expires each key itself (the TTL on its record).
  long long DeleteExpired(int /*batch*/) override { return 0; }

  const GuardOptions& options() const override { return options_; }

  // Lua for a script of the caller's own over the same records: now_ms(), keep_alive(key,
  // retention_ms), index(idx, key, now, retention_ms), load(key) (the record's fields, as
  // existing() reads them), store(key, hash, status, ctype, body, now, retention_ms) (an
  // answered key), existing(key, rec, hash, retention_ms) (what an earlier request left:
  // {'replayed'|'cancelled', status, ctype, body, headers} or {'refused', Refusal name}),
  // tombstone(key, idx, action_key, applied, body, ctype, now, retention_ms) (a compensation
  // that finds no action: {'refused', 'action_unknown'}, or nil with the tombstone written). It
  // starts with Redis 7's `#!lua` line: a script that writes is refused whole, before it runs,
  // when Redis is out of memory, so none stops half-way.
  static const std::string_view kLuaPrelude;
  // A script's answer from element `from` on: {'refused', name} → Refuse; {'replayed' |
  // 'cancelled' | 'applied' | a compensation's outcome, status, content type, body[, headers
  // JSON]} → that answer. Throws common::redis::Error for anything else.
  static Response AnswerOf(const common::redis::Reply& reply, size_t from = 0);

  // The names of the Redis keys, for stores of the caller's own, tests and operators. A tenant
  // id is [A-Za-z0-9_-]: the first ':' after the prefix ends it, whatever the key holds.
  static std::string RecordKey(const std::string& tenant_id, const std::string& key);
  static std::string IndexKey(const std::string& tenant_id);

 private:
  struct Claim;
  // The lease protocol of RunExternal and CompensateExternal over Redis: `claimed` is the
  // claim script's reply (an answer, or {'claimed', token, earlier, ...}); `call` runs with no
  // script running, and its answer is recorded under the token (marking `action_key`
  // compensated, when not empty).
  Response External(const Request& req, const common::redis::Reply& claimed,
                    const std::function<Response(const ExternalCall&, const Claim&)>& call,
                    const std::string& action_key);
  Response Record(const Request& req, long long token, const Response& res,
                  const std::string& action_key);

  common::redis::Pool& redis_;
  GuardOptions options_;
};

}  // namespace idemsaga::steps::guard
