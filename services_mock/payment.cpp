// The payment participant: charge for an order step, refund on compensation.
#include "common/crypto.hpp"
#include "common/http/server.hpp"
#include "common/pg/statement.hpp"
#include "services_mock/service.hpp"
#include "steps/order_schema.hpp"

namespace services_mock {
namespace {

using common::pg::Exec;

// The test card that is always declined (as in common payment APIs' test modes).
constexpr const char* kDeclinedCard = "pm_card_declined";

// Read from `claimed` (Guard::RunPlanned): the charge exists exactly when its key does.
constexpr const char* kCharge = R"sql(
  INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents,
                       currency, payment_method, status)
  SELECT $1, $2, $3, $4, $5::bigint, $6, $7, 'captured' FROM claimed)sql";
const common::pg::Statement kRefund{R"sql(
  UPDATE charges SET status = 'refunded', refunded_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'captured'
  RETURNING charge_id)sql"};

// The charge id is made here, so the answer is known before the charge is written: key,
// answer and charge commit in one statement.
steps::guard::PlannedEffect PlanCharge(const steps::guard::Request& req) {
  const auto& b = req.body;
  if (b["payment_method"] == kDeclinedCard) {
    return {steps::guard::Problem(402, "card_declined", "the card was declined")};
  }
  std::string id = "ch_" + common::RandomHex(16);
  nlohmann::json body = {{"charge_id", id},
                         {"amount_cents", b["amount_cents"]},
                         {"currency", b["currency"]},
                         {"status", "captured"}};
  return {{201, body.dump()},
          kCharge,
          {id, req.tenant_id, req.key, b["customer_id"].get<std::string>(),
           std::to_string(b["amount_cents"].get<long long>()), b["currency"].get<std::string>(),
           b["payment_method"].get<std::string>()}};
}

nlohmann::json Refund(pqxx::work& tx, const steps::guard::Request& req,
                      const steps::guard::ActionRecord& action) {
  auto rows = Exec(tx, kRefund, req.tenant_id, action.key);
  if (rows.empty()) return {{"refunded", false}};
  return {{"refunded", true}, {"charge_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterPaymentRoutes(common::http::Server& server, Participant& participant) {
  participant.PlannedAction(server, "/v1/charges", steps::ValidateCharge, PlanCharge);
  participant.Compensation(server, "/v1/refunds", Refund);
}

}  // namespace services_mock
