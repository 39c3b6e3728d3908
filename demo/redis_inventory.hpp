// The inventory participant with its stock and reservations in Redis, and its idempotency keys
// in the Redis guard's records (`idemsaga inventory --store redis`; steps/guard/redis_guard.hpp):
// the guard's promise and the effect kept by one Lua script per request.
//
// Each script reads the key's record, compares the fingerprint, applies the effect (every SKU
// of the order, or none) and stores the answer with its expiry, all in one step: Redis runs a
// script alone, so there is no gap between a claim and a read for a duplicate, or an expiry,
// to fall into, and nothing is ever half applied. The scripts are written over the guard's Lua
// (RedisGuard::kLuaPrelude: the record, replay, reuse, tombstone, compensated) and answer with
// names that RedisGuard::AnswerOf words from the protocol's tables, so the answers match the
// PostgreSQL inventory's byte for byte: 201 or a stored 409 insufficient_stock replayed with
// Idempotent-Replayed, 422 on reuse, tombstones, undone | already_undone | nothing_to_undo |
// cancelled, 409 compensated, 409 action_unknown.
//
// Redis layout (db of the URL), besides the guard's records: inv:stock:<sku> {available,
// reserved}; inv:res:<tenant>:<key> {reservation_id, items, status}.
//
// Thread-safe.
//   RedisInventory inv(redis, std::chrono::hours(168));
//   inv.guard().CheckServer(steps::guard::RedisFsync::kEverysec); inv.Seed();
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/http/server.hpp"
#include "common/redis/pool.hpp"
#include "demo/guarded_routes.hpp"
#include "steps/guard/redis_guard.hpp"

namespace idemsaga::demo {

struct StockLevel {
  long long available = 0;
  long long reserved = 0;
};

class RedisInventory {
 public:
  RedisInventory(common::redis::Pool& redis, std::chrono::seconds retention);

  // Its keys' guard: CheckServer, Ready, ListKeys (what /v1/idempotency/keys lists).
  steps::guard::RedisGuard& guard() { return guard_; }
  // The demo stock of sql/inventory/V001, written only where absent (restarts keep levels).
  void Seed();

  // POST /v1/reservations, under the guard.
  steps::guard::Response Reserve(const steps::guard::Request& req);
  // POST /v1/reservations/release: undoes the reservation under `action_key` at most once.
  steps::guard::Response Release(const steps::guard::Request& req, const std::string& action_key,
                                 bool action_applied);
  std::optional<StockLevel> Stock(const std::string& sku);

  std::chrono::seconds retention() const { return retention_; }

  // The names of its own Redis keys, for tests and operators (the records':
  // RedisGuard::RecordKey).
  static std::string StockKey(const std::string& sku);
  static std::string ReservationKey(const std::string& tenant_id, const std::string& key);

 private:
  common::redis::Pool& redis_;
  std::chrono::seconds retention_;
  steps::guard::RedisGuard guard_;
};

// The inventory's routes on a participant without a database: reservations, release and
// GET /v1/stock/{sku}.
void RegisterRedisInventoryRoutes(common::http::Server& server, GuardedRoutes& routes,
                                  RedisInventory& inventory);

}  // namespace idemsaga::demo
