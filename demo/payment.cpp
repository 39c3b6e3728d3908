// The payment participant: charge for an order step, refund on compensation. A card that
// needs 3-D Secure is only authorised (requires_action) until a capture takes the money.
#include "common/crypto.hpp"
#include "common/http/server.hpp"
#include "common/pg/statement.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "steps/order_schema.hpp"

namespace idemsaga::demo {
namespace {

using common::pg::Exec;

// The test card that is always declined (as in common payment APIs' test modes).
constexpr const char* kDeclinedCard = "pm_card_declined";
// The test card whose charges need the card holder's confirmation (3-D Secure) first.
constexpr const char* kThreeDSecureCard = "pm_card_3ds";

// Read from `claimed` (Guard::RunPlanned): the charge exists exactly when its key does.
constexpr const char* kCharge = R"sql(
  INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents,
                       currency, payment_method, status)
  SELECT $1, $2, $3, $4, $5::bigint, $6, $7, $8 FROM claimed)sql";
// A refund of an authorisation never captured voids it.
const common::pg::Statement kRefund{R"sql(
  UPDATE charges SET status = 'refunded', refunded_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status IN ('captured', 'requires_action')
  RETURNING charge_id)sql"};
const common::pg::Statement kCapture{R"sql(
  UPDATE charges SET status = 'captured'
  WHERE tenant_id = $1 AND charge_id = $2 AND status = 'requires_action'
  RETURNING amount_cents::text, currency)sql"};
const common::pg::Statement kChargeStatus{R"sql(
  SELECT status, amount_cents::text, currency FROM charges
  WHERE tenant_id = $1 AND charge_id = $2)sql"};
// The compensation of a capture: the money goes back.
const common::pg::Statement kRefundCharge{R"sql(
  UPDATE charges SET status = 'refunded', refunded_at = now()
  WHERE tenant_id = $1 AND charge_id = $2 AND status IN ('captured', 'requires_action')
  RETURNING charge_id)sql"};

// The charge id is made here, so the answer is known before the charge is written: key,
// answer and charge commit in one statement.
steps::guard::PlannedEffect PlanCharge(const steps::guard::Request& req) {
  const auto& b = req.body;
  if (b["payment_method"] == kDeclinedCard) {
    return {steps::guard::Problem(402, kCardDeclined, "the card was declined")};
  }
  bool confirm = b["payment_method"] == kThreeDSecureCard;
  // A caller that cannot wait for the card holder (it did not say it can) is refused: an
  // authorisation it would take for a capture would hold the customer's money for ever.
  if (confirm && !b.value("three_d_secure", false)) {
    return {steps::guard::Problem(402, kAuthenticationRequired,
                                  "the card needs 3-D Secure, which this caller does not support")};
  }
  std::string id = "ch_" + common::RandomHex(16);
  const char* status = confirm ? "requires_action" : "captured";
  nlohmann::json body = {{"charge_id", id},
                         {"amount_cents", b["amount_cents"]},
                         {"currency", b["currency"]},
                         {"status", status}};
  if (confirm) body["next_action"] = {{"type", "three_d_secure"}};
  return {{201, body.dump()},
          kCharge,
          {id, req.tenant_id, req.key, b["customer_id"].get<std::string>(),
           std::to_string(b["amount_cents"].get<long long>()), b["currency"].get<std::string>(),
           b["payment_method"].get<std::string>(), status}};
}

// Takes the money of an authorised charge. A charge already captured answers the same; one
// refunded (voided) or unknown cannot be captured (a business refusal: the saga compensates).
steps::guard::Response Capture(pqxx::work& tx, const steps::guard::Request& req) {
  const std::string id = req.body["charge_id"].get<std::string>();
  std::string amount, currency;
  if (auto rows = Exec(tx, kCapture, req.tenant_id, id); !rows.empty()) {
    amount = rows[0][0].as<std::string>();
    currency = rows[0][1].as<std::string>();
  } else {
    auto found = Exec(tx, kChargeStatus, req.tenant_id, id);
    if (found.empty() || found[0][0].as<std::string>() != "captured") {
      return steps::guard::Problem(
          409, kChargeNotCapturable,
          found.empty() ? "no such charge" : "the charge was refunded; it cannot be captured");
    }
    amount = found[0][1].as<std::string>();
    currency = found[0][2].as<std::string>();
  }
  nlohmann::json body = {{"charge_id", id},
                         {"amount_cents", std::stoll(amount)},
                         {"currency", currency},
                         {"status", "captured"}};
  return {200, body.dump()};
}

nlohmann::json RefundCapture(pqxx::work& tx, const steps::guard::Request& req,
                             const steps::guard::ActionRecord& action) {
  auto id = action.body.value("charge_id", "");
  auto rows = Exec(tx, kRefundCharge, req.tenant_id, id);
  return {{"refunded", !rows.empty()}, {"charge_id", id}};
}

nlohmann::json Refund(pqxx::work& tx, const steps::guard::Request& req,
                      const steps::guard::ActionRecord& action) {
  auto rows = Exec(tx, kRefund, req.tenant_id, action.key);
  if (rows.empty()) return {{"refunded", false}};
  return {{"refunded", true}, {"charge_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterPaymentRoutes(common::http::Server& server, GuardedRoutes& routes) {
  routes.PlannedAction(server, "/v1/charges", steps::ValidateCharge, PlanCharge);
  routes.Compensation(server, "/v1/refunds", Refund);
  routes.Action(server, "/v1/captures", steps::ValidateCapture, Capture);
  routes.Compensation(server, "/v1/captures/refund", RefundCapture);
}

}  // namespace idemsaga::demo
