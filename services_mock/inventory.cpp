// The inventory participant: reserve stock for an order step, release it on compensation.
#include <map>

#include "common/http/server.hpp"
#include "services_mock/service.hpp"
#include "steps/order_schema.hpp"

namespace services_mock {
namespace {

constexpr const char* kLockSku = "SELECT available FROM stock WHERE sku = $1 FOR UPDATE";
constexpr const char* kTake =
    "UPDATE stock SET available = available - $2, reserved = reserved + $2 WHERE sku = $1";
constexpr const char* kGiveBack =
    "UPDATE stock SET available = available + $2, reserved = reserved - $2 WHERE sku = $1";
constexpr const char* kInsertReservation = R"sql(
  INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status)
  VALUES ('res_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3::jsonb, 'reserved')
  RETURNING reservation_id)sql";
constexpr const char* kRelease = R"sql(
  UPDATE reservations SET status = 'released', released_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'reserved'
  RETURNING reservation_id, items::text)sql";
constexpr const char* kStockOf = "SELECT available, reserved FROM stock WHERE sku = $1";

// Quantities per SKU, in SKU order: rows are locked in one global order to avoid deadlocks.
std::map<std::string, long long> BySku(const nlohmann::json& items) {
  std::map<std::string, long long> out;
  for (const auto& item : items) {
    out[item["sku"].get<std::string>()] += item["quantity"].get<long long>();
  }
  return out;
}

steps::guard::Response Reserve(pqxx::work& tx, const steps::guard::Request& req) {
  auto wanted = BySku(req.body["items"]);
  for (const auto& [sku, quantity] : wanted) {
    auto rows = tx.exec_params(kLockSku, sku);
    long long available = rows.empty() ? 0 : rows[0][0].as<long long>();
    if (rows.empty() || available < quantity) {
      // Stored and replayed; nothing was changed above this point.
      std::string why = rows.empty() ? "unknown SKU '" + sku + "'"
                                     : "only " + std::to_string(available) + " of '" + sku +
                                           "' available, " + std::to_string(quantity) + " wanted";
      return {409, common::http::ErrorBody("insufficient_stock", why)};
    }
  }
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [sku, quantity] : wanted) {
    tx.exec_params(kTake, sku, quantity);
    items.push_back({{"sku", sku}, {"quantity", quantity}});
  }
  auto id = tx.exec_params1(kInsertReservation, req.tenant_id, req.key, items.dump())[0];
  nlohmann::json body = {{"reservation_id", id.as<std::string>()}, {"items", items}};
  return {201, body.dump()};
}

nlohmann::json Release(pqxx::work& tx, const steps::guard::Request& req,
                       const steps::guard::ActionRecord& action) {
  auto rows = tx.exec_params(kRelease, req.tenant_id, action.key);
  if (rows.empty()) return {{"released", false}};
  auto items = nlohmann::json::parse(rows[0][1].as<std::string>());
  for (const auto& [sku, quantity] : BySku(items)) tx.exec_params(kGiveBack, sku, quantity);
  return {{"released", true}, {"reservation_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterInventoryRoutes(common::http::Server& server, Participant& participant) {
  participant.Action(server, "/v1/reservations", steps::ValidateReservation, Reserve);
  participant.Compensation(server, "/v1/reservations/release", Release);
  server.Get(R"(/v1/stock/([a-z0-9_-]{1,64}))",
             [&participant](const httplib::Request& req, httplib::Response& res) {
               if (!participant.Authorized(req, res)) return;
               std::string sku = req.matches[1];
               auto rows = participant.pool().With([&](pqxx::connection& conn) {
                 pqxx::read_transaction tx(conn);
                 return tx.exec_params(kStockOf, sku);
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
