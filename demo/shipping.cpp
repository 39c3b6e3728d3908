// The shipping participant: book a shipment of an order step's reserved stock, cancel it on
// compensation, and read it back for the tenant that booked it.
#include <string>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/statement.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "steps/order_schema.hpp"

namespace idemsaga::demo {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;

// The destination no carrier serves (Antarctica): the demo's business refusal, as the declined
// card is payment's.
constexpr const char* kUnservedCountry = "AQ";

const common::pg::Statement kInsertShipment{R"sql(
  INSERT INTO shipments (shipment_id, tenant_id, idempotency_key, reservation_id, address,
                         status)
  VALUES ('shp_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3, $4::jsonb, 'created')
  RETURNING shipment_id)sql"};
const common::pg::Statement kCancel{R"sql(
  UPDATE shipments SET status = 'cancelled', cancelled_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'created'
  RETURNING shipment_id)sql"};
const common::pg::Statement kShipmentOf{R"sql(
  SELECT status, reservation_id, address->>'country' FROM shipments
  WHERE tenant_id = $1 AND shipment_id = $2)sql"};

steps::guard::Response Ship(pqxx::work& tx, const steps::guard::Request& req) {
  const auto& b = req.body;
  const auto country = b["address"]["country"].get<std::string>();
  if (country == kUnservedCountry) {
    // Stored and replayed by the guard; nothing was written, so there is nothing to cancel.
    return steps::guard::Problem(422, kAddressUnserviceable,
                                 "no carrier ships to country '" + country + "'");
  }
  auto id = ExecOne(tx, kInsertShipment, req.tenant_id, req.key,
                    b["reservation_id"].get<std::string>(), b["address"].dump())[0];
  nlohmann::json body = {{"shipment_id", id.as<std::string>()},
                         {"status", "created"},
                         {"reservation_id", b["reservation_id"]},
                         {"country", country}};
  steps::guard::Response res{201, body.dump()};
  res.headers["Location"] = "/v1/shipments/" + id.as<std::string>();  // replayed with the body
  return res;
}

nlohmann::json Cancel(pqxx::work& tx, const steps::guard::Request& req,
                      const steps::guard::ActionRecord& action) {
  auto rows = Exec(tx, kCancel, req.tenant_id, action.key);
  if (rows.empty()) return {{"cancelled", false}};
  return {{"cancelled", true}, {"shipment_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterShippingRoutes(common::http::Server& server, GuardedRoutes& routes) {
  routes.Action(server, "/v1/shipments", steps::ValidateShipment, Ship);
  routes.Compensation(server, "/v1/shipments/cancel", Cancel);
  // Only ids of the form the INSERT makes: GET /v1/shipments/cancel stays 405 (POST only).
  server.Get(R"(/v1/shipments/(shp_[0-9a-f]{32}))", [&routes](const httplib::Request& req,
                                                              httplib::Response& res) {
    if (!routes.Authorized(req, res)) return;
    // A shipment belongs to the tenant that booked it: another tenant sees 404.
    auto tenant = req.get_header_value("X-Tenant-ID");
    if (!common::IsValidTenantId(tenant)) {
      common::http::SetError(res, 401, "unauthorized", "X-Tenant-ID must be 1-64 of [A-Za-z0-9_-]");
      return;
    }
    std::string id = req.matches[1].str();
    auto rows = routes.pool().With([&](pqxx::connection& conn) {
      pqxx::read_transaction tx(conn);
      return Exec(tx, kShipmentOf, tenant, id);
    });
    if (rows.empty()) {
      common::http::SetError(res, 404, "not_found", "unknown shipment '" + id + "'");
      return;
    }
    nlohmann::json body = {{"shipment_id", id},
                           {"status", rows[0][0].as<std::string>()},
                           {"reservation_id", rows[0][1].as<std::string>()},
                           {"country", rows[0][2].as<std::string>()}};
    res.set_content(body.dump(), "application/json");
  });
}

}  // namespace idemsaga::demo
