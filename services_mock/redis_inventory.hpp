// The inventory participant with its stock, reservations and idempotency keys in Redis
// (`idemsaga inventory --store redis`): the guard's promise kept by one Lua script per request.
//
// Each script reads the key's record, compares the fingerprint, applies the effect (every SKU
// of the order, or none) and stores the answer with its expiry, all in one step: Redis runs a
// script alone, so there is no gap between a claim and a read for a duplicate, or an expiry,
// to fall into, and nothing is ever half applied. Answers match the PostgreSQL inventory's
// byte for byte: 201 or a stored 409 insufficient_stock replayed with Idempotent-Replayed,
// 422 on reuse, tombstones, undone | already_undone | nothing_to_undo | cancelled, 409
// compensated, 409 action_unknown. Keys expire GuardOptions::retention after their last
// write (a compensation restarts an action's clock; a key read past half its life is kept a
// full retention again), as the orchestrator's start-up check expects.
//
// Redis layout (db of the URL): inv:stock:<sku> {available, reserved};
// idem:<tenant>:<key> {status, hash, rs, ct, body, comp, t}; inv:res:<tenant>:<key>
// {reservation_id, items, status}; idem-index:<tenant> a sorted set of keys by write time.
// Needs Redis 7 (script flags: a script is refused whole when Redis is out of memory).
//
// Thread-safe.
//   RedisInventory inv(redis, std::chrono::hours(168));
//   inv.CheckServer(RedisFsync::kEverysec); inv.Seed();
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/http/server.hpp"
#include "services_mock/participant.hpp"
#include "services_mock/redis_pool.hpp"
#include "steps/guard/guard.hpp"

namespace services_mock {

// The persistence the inventory requires of its Redis at start-up.
enum class RedisFsync {
  // appendonly yes and appendfsync everysec (or always): a crash of Redis' host may lose up
  // to about a second of acknowledged writes (docs/participants.md, "Inventory on Redis").
  kEverysec,
  // appendfsync always: every acknowledged write is on disk.
  kAlways,
  // Not checked (CONFIG is disabled, as on some managed Redis): the operator vouches.
  kUnchecked,
};
// "everysec", "always" or "unchecked"; nullopt for anything else.
std::optional<RedisFsync> ParseRedisFsync(const std::string& name);

struct StockLevel {
  long long available = 0;
  long long reserved = 0;
};

class RedisInventory {
 public:
  RedisInventory(RedisPool& redis, std::chrono::seconds retention);

  // Throws std::runtime_error (naming the setting to change) when the server would lose keys
  // beyond what `fsync` accepts, or could evict them (a maxmemory policy other than
  // noeviction); RedisUnavailable when it cannot be reached.
  void CheckServer(RedisFsync fsync);
  // The demo stock of sql/inventory/V001, written only where absent (restarts keep levels).
  void Seed();
  // True when Redis answers PING.
  bool Ready();

  // POST /v1/reservations, under the guard.
  steps::guard::Response Reserve(const steps::guard::Request& req);
  // POST /v1/reservations/release: undoes the reservation under `action_key` at most once.
  steps::guard::Response Release(const steps::guard::Request& req, const std::string& action_key,
                                 bool action_applied);
  std::optional<StockLevel> Stock(const std::string& sku);
  // What /v1/idempotency/keys lists: a tenant's keys written in the last `since`.
  std::vector<steps::guard::KeyRecord> ListKeys(const std::string& tenant_id,
                                                std::chrono::seconds since,
                                                const std::string& after, int limit);

  std::chrono::seconds retention() const { return retention_; }

  // The names of the Redis keys, for tests and operators.
  static std::string StockKey(const std::string& sku);
  static std::string RecordKey(const std::string& tenant_id, const std::string& key);
  static std::string ReservationKey(const std::string& tenant_id, const std::string& key);
  static std::string IndexKey(const std::string& tenant_id);

 private:
  RedisPool& redis_;
  std::chrono::seconds retention_;
};

// The inventory's routes on a participant without a database: reservations, release and
// GET /v1/stock/{sku}.
void RegisterRedisInventoryRoutes(common::http::Server& server, Participant& participant,
                                  RedisInventory& inventory);

}  // namespace services_mock
