// The payment participant: charge for an order step, refund on compensation.
#include "common/http/server.hpp"
#include "services_mock/service.hpp"

namespace services_mock {
namespace {

// One million dollars in cents: far above any demo order, far below bigint trouble.
constexpr long long kMaxAmountCents = 100'000'000;
// The test card that is always declined (as in common payment APIs' test modes).
constexpr const char* kDeclinedCard = "pm_card_declined";

constexpr const char* kInsertCharge = R"sql(
  INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents,
                       currency, payment_method, status)
  VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3, $4, $5, $6,
          'captured')
  RETURNING charge_id)sql";
constexpr const char* kRefund = R"sql(
  UPDATE charges SET status = 'refunded', refunded_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'captured'
  RETURNING charge_id)sql";

bool Matches(const std::string& s, size_t max, bool (*ok)(char)) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!ok(c)) return false;
  }
  return true;
}

std::string ValidateCharge(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  for (const auto& [name, _] : body.items()) {
    if (name != "amount_cents" && name != "currency" && name != "customer_id" &&
        name != "payment_method") {
      return "unknown field '" + name + "'";
    }
  }
  if (!body.contains("amount_cents") || !body["amount_cents"].is_number_integer() ||
      body["amount_cents"].get<long long>() < 1 ||
      body["amount_cents"].get<long long>() > kMaxAmountCents) {
    return "amount_cents must be an integer from 1 to " + std::to_string(kMaxAmountCents);
  }
  if (!body.contains("currency") || !body["currency"].is_string() ||
      !Matches(body["currency"].get<std::string>(), 3, [](char c) { return c >= 'A' && c <= 'Z'; }) ||
      body["currency"].get<std::string>().size() != 3) {
    return "currency must be a three-letter upper-case ISO 4217 code";
  }
  if (!body.contains("customer_id") || !body["customer_id"].is_string() ||
      !Matches(body["customer_id"].get<std::string>(), 64,
               [](char c) { return c > 0x20 && c < 0x7f; })) {
    return "customer_id must be 1-64 printable characters without spaces";
  }
  if (!body.contains("payment_method") || !body["payment_method"].is_string() ||
      !Matches(body["payment_method"].get<std::string>(), 64, [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      })) {
    return "payment_method must be 1-64 of [a-z0-9_]";
  }
  return "";
}

steps::guard::Response Charge(pqxx::work& tx, const steps::guard::Request& req) {
  const auto& b = req.body;
  if (b["payment_method"] == kDeclinedCard) {
    return {402, common::http::ErrorBody("card_declined", "the card was declined")};
  }
  auto id = tx.exec_params1(kInsertCharge, req.tenant_id, req.key,
                            b["customer_id"].get<std::string>(),
                            b["amount_cents"].get<long long>(), b["currency"].get<std::string>(),
                            b["payment_method"].get<std::string>())[0];
  nlohmann::json body = {{"charge_id", id.as<std::string>()},
                         {"amount_cents", b["amount_cents"]},
                         {"currency", b["currency"]},
                         {"status", "captured"}};
  return {201, body.dump()};
}

nlohmann::json Refund(pqxx::work& tx, const steps::guard::Request& req,
                      const steps::guard::ActionRecord& action) {
  auto rows = tx.exec_params(kRefund, req.tenant_id, action.key);
  if (rows.empty()) return {{"refunded", false}};
  return {{"refunded", true}, {"charge_id", rows[0][0].as<std::string>()}};
}

}  // namespace

void RegisterPaymentRoutes(common::http::Server& server, Participant& participant) {
  participant.Action(server, "/v1/charges", ValidateCharge, Charge);
  participant.Compensation(server, "/v1/refunds", Refund);
}

}  // namespace services_mock
