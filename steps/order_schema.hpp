// The wire shapes of an order and of its steps, validated once at each HTTP edge (the
// orchestrator's POST /v1/orders and the participants' routes share these rules).
// Each function returns "" when the JSON is acceptable, else a message naming the field.
// Pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace idemsaga::steps {

inline constexpr long long kMaxQuantity = 1'000'000;
inline constexpr size_t kMaxItems = 100;
// One million dollars in cents: far above any demo order, far below bigint trouble.
inline constexpr long long kMaxAmountCents = 100'000'000;
// Bytes of an address's name, line1 or city: room for any real one in UTF-8, bounded rows.
inline constexpr size_t kMaxAddressText = 200;
// Characters of a postal code: the longest in use is 10 (e.g. "12345-6789"); margin for more.
inline constexpr size_t kMaxPostalCode = 16;

// {"items":[{"sku":"widget","quantity":2}]}: the inventory step's body.
std::string ValidateReservation(const nlohmann::json& body);
// {"amount_cents","currency","customer_id","payment_method"}: the payment step's body.
std::string ValidateCharge(const nlohmann::json& body);
// POST /v1/captures: {"charge_id": "ch_" + 32 hex}.
std::string ValidateCapture(const nlohmann::json& body);
// {"reservation_id":"res_<32 hex>","address":{"name","line1","city","postal_code","country"}}:
// the shipping step's body.
std::string ValidateShipment(const nlohmann::json& body);
// {"name","line1","city","postal_code","country"}: a shipment's address, wherever it is sent.
// `at` prefixes the field names in the message ("address." gives "address.country must ...").
std::string ValidateAddress(const nlohmann::json& address, const std::string& at);
// The order: the union of both, as POST /v1/orders takes it.
std::string ValidateOrder(const nlohmann::json& body);

}  // namespace idemsaga::steps
