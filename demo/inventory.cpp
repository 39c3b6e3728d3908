// The inventory participant: reserve stock for an order step, release it on compensation.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "common/crypto.hpp"
#include "common/http/server.hpp"
#include "common/pg/statement.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "steps/order_schema.hpp"

namespace idemsaga::demo {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;

constexpr int kSlots = 16;  // sql/inventory/V002__stock_slots.sql

// The first slot, from `$3` on, that has the units and that no other reservation holds right
// now: concurrent reservations of one SKU take different slots and never wait for each other.
// The slot is a CTE the UPDATE joins (see kTakeFreeSlotOnce).
const common::pg::Statement kTakeFromFreeSlot{R"sql(
  WITH free AS (
    SELECT sku, slot FROM stock_slots
    WHERE sku = $1 AND available >= $2
    ORDER BY (slot + 16 - $3) % 16
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
  UPDATE stock_slots s SET available = s.available - $2, reserved = s.reserved + $2
  FROM free WHERE (s.sku, s.slot) = (free.sku, free.slot)
  RETURNING s.slot)sql"};
// No single free slot had them: wait for every slot of the SKU (in slot order, as everyone
// who locks several does) and count them all.
const common::pg::Statement kLockAllSlots{R"sql(
  SELECT slot, available FROM stock_slots WHERE sku = $1 ORDER BY slot FOR UPDATE)sql"};
const common::pg::Statement kTake{R"sql(
  UPDATE stock_slots SET available = available - $3, reserved = reserved + $3
  WHERE sku = $1 AND slot = $2)sql"};
const common::pg::Statement kGiveBack{R"sql(
  UPDATE stock_slots SET available = available + $3, reserved = reserved - $3
  WHERE sku = $1 AND slot = $2)sql"};
const common::pg::Statement kInsertReservation{R"sql(
  INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status, slots)
  VALUES ('res_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3::jsonb, 'reserved',
          $4::jsonb)
  RETURNING reservation_id)sql"};
// One SKU (most orders), planned (Guard::RunPlanned): a free slot taken, the reservation
// recorded and the key stored in one statement. No row from `taken`: no single free slot had
// the units, nothing is taken or recorded, and Reserve decides.
// The slot is a CTE the UPDATE joins, not a scalar subquery in its WHERE: under contention
// that form sometimes locked a slot and then updated no row, which committed a transaction of
// row locks alone and sent the reservation to Reserve's second transaction.
constexpr const char* kTakeFreeSlotOnce = R"sql(
  free AS (
    SELECT sku, slot FROM stock_slots
    WHERE sku = $4::text AND available >= $5::bigint AND EXISTS (SELECT 1 FROM claimed)
    ORDER BY (slot + 16 - $6::int) % 16
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
  taken AS (
    UPDATE stock_slots s
    SET available = s.available - $5::bigint, reserved = s.reserved + $5::bigint
    FROM free WHERE (s.sku, s.slot) = (free.sku, free.slot)
    RETURNING s.slot))sql";
constexpr const char* kRecordTaken = R"sql(
  INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status, slots)
  SELECT $1, $2, $3,
         jsonb_build_array(jsonb_build_object('sku', $4::text, 'quantity', $5::bigint)),
         'reserved',
         jsonb_build_array(jsonb_build_object('sku', $4::text, 'slot', slot,
                                              'quantity', $5::bigint))
  FROM taken
  RETURNING 1)sql";
const common::pg::Statement kRelease{R"sql(
  UPDATE reservations SET status = 'released', released_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'reserved'
  RETURNING reservation_id, items::text, coalesce(slots::text, 'null'))sql"};
const common::pg::Statement kStockOf{"SELECT available, reserved FROM stock WHERE sku = $1"};

// Quantities per SKU, in SKU order: rows are locked in one global order to avoid deadlocks.
std::map<std::string, long long> BySku(const nlohmann::json& items) {
  std::map<std::string, long long> out;
  for (const auto& item : items) {
    out[item["sku"].get<std::string>()] += item["quantity"].get<long long>();
  }
  return out;
}

struct Taken {
  std::string sku;
  int slot;
  long long quantity;
};

// Takes `quantity` units of `sku` into `taken`; the reason when the SKU does not have them
// (then nothing of this SKU was taken).
std::optional<std::string> TakeUnits(pqxx::work& tx, const std::string& sku, long long quantity,
                                     int start_slot, std::vector<Taken>& taken) {
  auto fast = Exec(tx, kTakeFromFreeSlot, sku, quantity, start_slot);
  if (!fast.empty()) {
    taken.push_back({sku, fast[0][0].as<int>(), quantity});
    return std::nullopt;
  }
  auto slots = Exec(tx, kLockAllSlots, sku);
  if (slots.empty()) return "unknown SKU '" + sku + "'";
  long long available = 0;
  for (const auto& row : slots) available += row[1].as<long long>();
  if (available < quantity) {
    return "only " + std::to_string(available) + " of '" + sku + "' available, " +
           std::to_string(quantity) + " wanted";
  }
  long long left = quantity;
  for (const auto& row : slots) {
    long long take = std::min(left, row[1].as<long long>());
    if (take == 0) continue;
    Exec(tx, kTake, sku, row[0].as<int>(), take);
    taken.push_back({sku, row[0].as<int>(), take});
    if ((left -= take) == 0) break;
  }
  return std::nullopt;
}

// Where the search for a free slot starts: spread by key, so concurrent reservations start
// apart.
int StartSlot(const std::string& key) {
  return static_cast<int>(std::hash<std::string>{}(key) % kSlots);
}

nlohmann::json ItemsOf(const std::map<std::string, long long>& wanted) {
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [sku, quantity] : wanted) {
    items.push_back({{"sku", sku}, {"quantity", quantity}});
  }
  return items;
}

// Any reservation, in the guard's transaction: what a plan cannot express (several SKUs, or
// no single free slot), and the answer to a key already there.
steps::guard::Response Reserve(pqxx::work& tx, const steps::guard::Request& req) {
  const auto wanted = BySku(req.body["items"]);
  std::vector<Taken> taken;
  for (const auto& [sku, quantity] : wanted) {
    if (auto why = TakeUnits(tx, sku, quantity, StartSlot(req.key), taken)) {
      // Stored and replayed, in this transaction: give back what the SKUs before took.
      for (const auto& t : taken) Exec(tx, kGiveBack, t.sku, t.slot, t.quantity);
      return steps::guard::Problem(409, kInsufficientStock, *why);
    }
  }
  nlohmann::json slots = nlohmann::json::array();
  for (const auto& t : taken) {
    slots.push_back({{"sku", t.sku}, {"slot", t.slot}, {"quantity", t.quantity}});
  }
  const auto items = ItemsOf(wanted);
  auto id = ExecOne(tx, kInsertReservation, req.tenant_id, req.key, items.dump(), slots.dump())[0];
  nlohmann::json body = {{"reservation_id", id.as<std::string>()}, {"items", items}};
  return {201, body.dump()};
}

// One SKU: the reservation id is made here, so the answer is known before the slot is taken.
steps::guard::PlannedEffect PlanReservation(const steps::guard::Request& req) {
  steps::guard::PlannedEffect plan{
      .otherwise = [&req](pqxx::work& tx) { return Reserve(tx, req); }};
  const auto wanted = BySku(req.body["items"]);
  if (wanted.size() != 1) return plan;
  const auto& [sku, quantity] = *wanted.begin();
  std::string id = "res_" + common::RandomHex(16);
  plan.answer = {201, nlohmann::json{{"reservation_id", id}, {"items", ItemsOf(wanted)}}.dump()};
  plan.ctes = kTakeFreeSlotOnce;
  plan.sql = kRecordTaken;
  plan.params = {id,
                 req.tenant_id,
                 req.key,
                 sku,
                 std::to_string(quantity),
                 std::to_string(StartSlot(req.key))};
  return plan;
}

nlohmann::json Release(pqxx::work& tx, const steps::guard::Request& req,
                       const steps::guard::ActionRecord& action) {
  auto rows = Exec(tx, kRelease, req.tenant_id, action.key);
  if (rows.empty()) return {{"released", false}};
  auto slots = nlohmann::json::parse(rows[0][2].as<std::string>());
  if (slots.is_null()) {  // reserved before stock had slots: slot 0 holds what it reserved
    for (const auto& [sku, quantity] : BySku(nlohmann::json::parse(rows[0][1].as<std::string>()))) {
      Exec(tx, kGiveBack, sku, 0, quantity);
    }
  } else {
    // In (sku, slot) order, like every transaction that locks several slots.
    std::vector<Taken> taken;
    for (const auto& t : slots) {
      taken.push_back(
          {t["sku"].get<std::string>(), t["slot"].get<int>(), t["quantity"].get<long long>()});
    }
    std::sort(taken.begin(), taken.end(), [](const Taken& a, const Taken& b) {
      return std::tie(a.sku, a.slot) < std::tie(b.sku, b.slot);
    });
    for (const auto& t : taken) Exec(tx, kGiveBack, t.sku, t.slot, t.quantity);
  }
  return {{"released", true}, {"reservation_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterInventoryRoutes(common::http::Server& server, GuardedRoutes& routes) {
  routes.PlannedAction(server, "/v1/reservations", steps::ValidateReservation, PlanReservation);
  routes.Compensation(server, "/v1/reservations/release", Release);
  server.Get(R"(/v1/stock/([a-z0-9_-]{1,64}))",
             [&routes](const httplib::Request& req, httplib::Response& res) {
               if (!routes.Authorized(req, res)) return;
               std::string sku = common::http::DecodeCapture(req.matches[1].str());
               auto rows = routes.pool().With([&](pqxx::connection& conn) {
                 pqxx::read_transaction tx(conn);
                 return Exec(tx, kStockOf, sku);
               });
               if (rows.empty()) {
                 common::http::SetError(res, 404, "not_found", "unknown SKU '" + sku + "'");
                 return;
               }
               nlohmann::json body = {{"sku", sku},
                                      {"available", rows[0][0].as<long long>()},
                                      {"reserved", rows[0][1].as<long long>()}};
               res.set_content(body.dump(), "application/json");
             });
}

}  // namespace idemsaga::demo
