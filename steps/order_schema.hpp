// The wire shapes of an order and of its steps, validated once at each HTTP edge (the
// orchestrator's POST /v1/orders and the participants' routes share these rules).
// Each function returns "" when the JSON is acceptable, else a message naming the field.
// Pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace steps {

inline constexpr long long kMaxQuantity = 1'000'000;
inline constexpr size_t kMaxItems = 100;
// One million dollars in cents: far above any demo order, far below bigint trouble.
inline constexpr long long kMaxAmountCents = 100'000'000;

// {"items":[{"sku":"widget","quantity":2}]}: the inventory step's body.
std::string ValidateReservation(const nlohmann::json& body);
// {"amount_cents","currency","customer_id","payment_method"}: the payment step's body.
std::string ValidateCharge(const nlohmann::json& body);
// The order: the union of both, as POST /v1/orders takes it.
std::string ValidateOrder(const nlohmann::json& body);

}  // namespace steps
