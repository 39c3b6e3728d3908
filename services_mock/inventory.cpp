// The inventory participant: reserve stock for an order step, release it on compensation.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "common/http/server.hpp"
#include "common/pg/statement.hpp"
#include "services_mock/service.hpp"
#include "steps/order_schema.hpp"

namespace services_mock {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;

constexpr int kSlots = 16;  // sql/inventory/V002__stock_slots.sql

// The first slot, from `$3` on, that has the units and that no other reservation holds right
// now: concurrent reservations of one SKU take different slots and never wait for each other.
const common::pg::Statement kTakeFromFreeSlot{R"sql(
  UPDATE stock_slots SET available = available - $2, reserved = reserved + $2
  WHERE (sku, slot) = (SELECT sku, slot FROM stock_slots
                       WHERE sku = $1 AND available >= $2
                       ORDER BY (slot + 16 - $3) % 16
                       LIMIT 1
                       FOR UPDATE SKIP LOCKED)
  RETURNING slot)sql"};
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
// One SKU (most orders), fast path and record in one statement: a round trip and an executor
// start fewer than kTakeFromFreeSlot + kInsertReservation. No row: no single free slot had the
// units, and nothing was taken or recorded.
const common::pg::Statement kReserveFromFreeSlot{R"sql(
  WITH taken AS (
    UPDATE stock_slots SET available = available - $4::bigint, reserved = reserved + $4::bigint
    WHERE (sku, slot) = (SELECT sku, slot FROM stock_slots
                         WHERE sku = $3::text AND available >= $4::bigint
                         ORDER BY (slot + 16 - $5::int) % 16
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED)
    RETURNING slot)
  INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status, slots)
  SELECT 'res_' || replace(gen_random_uuid()::text, '-', ''), $1, $2,
         jsonb_build_array(jsonb_build_object('sku', $3::text, 'quantity', $4::bigint)),
         'reserved',
         jsonb_build_array(jsonb_build_object('sku', $3::text, 'slot', slot,
                                              'quantity', $4::bigint))
  FROM taken
  RETURNING reservation_id)sql"};
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
// `try_free_slot`: false when kReserveFromFreeSlot just found no free slot.
std::optional<std::string> TakeUnits(pqxx::work& tx, const std::string& sku, long long quantity,
                                     int start_slot, bool try_free_slot,
                                     std::vector<Taken>& taken) {
  if (try_free_slot) {
    auto fast = Exec(tx, kTakeFromFreeSlot, sku, quantity, start_slot);
    if (!fast.empty()) {
      taken.push_back({sku, fast[0][0].as<int>(), quantity});
      return std::nullopt;
    }
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

steps::guard::Response Reserve(pqxx::work& tx, const steps::guard::Request& req) {
  // Where the search for a free slot starts: spread by key, so concurrent reservations start
  // apart.
  int start_slot = static_cast<int>(std::hash<std::string>{}(req.key) % kSlots);
  const auto wanted = BySku(req.body["items"]);
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [sku, quantity] : wanted) {
    items.push_back({{"sku", sku}, {"quantity", quantity}});
  }
  const bool one_sku = wanted.size() == 1;
  if (one_sku) {
    const auto& [sku, quantity] = *wanted.begin();
    auto id = Exec(tx, kReserveFromFreeSlot, req.tenant_id, req.key, sku, quantity, start_slot);
    if (!id.empty()) {
      nlohmann::json body = {{"reservation_id", id[0][0].as<std::string>()}, {"items", items}};
      return {201, body.dump()};
    }
  }
  std::vector<Taken> taken;
  for (const auto& [sku, quantity] : wanted) {
    if (auto why = TakeUnits(tx, sku, quantity, start_slot, !one_sku, taken)) {
      // Stored and replayed, in this transaction: give back what the SKUs before took.
      for (const auto& t : taken) Exec(tx, kGiveBack, t.sku, t.slot, t.quantity);
      return steps::guard::Problem(409, "insufficient_stock", *why);
    }
  }
  nlohmann::json slots = nlohmann::json::array();
  for (const auto& t : taken) {
    slots.push_back({{"sku", t.sku}, {"slot", t.slot}, {"quantity", t.quantity}});
  }
  auto id = ExecOne(tx, kInsertReservation, req.tenant_id, req.key, items.dump(), slots.dump())[0];
  nlohmann::json body = {{"reservation_id", id.as<std::string>()}, {"items", items}};
  return {201, body.dump()};
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

void RegisterInventoryRoutes(common::http::Server& server, Participant& participant) {
  participant.Action(server, "/v1/reservations", steps::ValidateReservation, Reserve);
  participant.Compensation(server, "/v1/reservations/release", Release);
  server.Get(R"(/v1/stock/([a-z0-9_-]{1,64}))",
             [&participant](const httplib::Request& req, httplib::Response& res) {
               if (!participant.Authorized(req, res)) return;
               std::string sku = common::http::DecodeCapture(req.matches[1].str());
               auto rows = participant.pool().With([&](pqxx::connection& conn) {
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

}  // namespace services_mock
