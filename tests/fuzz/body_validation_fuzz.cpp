// libFuzzer harness for the request bodies every service validates once at its edge: the
// order (POST /v1/orders), the reservation, the charge and the shipment (the participants'
// actions), once the route has parsed them as JSON. Beyond "no crash, no leak, no UB": a body
// a validator accepts has exactly the shape the saga relies on (items an array of
// 1..kMaxItems with bounded positive quantities, an amount within bounds, an address with
// every field), so nothing downstream can throw.
// Built only with -DIDEMSAGA_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt has the commands).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "steps/order_schema.hpp"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckItems(const nlohmann::json& body) {
  const auto& items = body.at("items");
  Check(items.is_array() && !items.empty() && items.size() <= idemsaga::steps::kMaxItems);
  for (const auto& item : items) {
    long long q = item.at("quantity").get<long long>();
    Check(q >= 1 && q <= idemsaga::steps::kMaxQuantity);
    Check(item.at("sku").is_string());
  }
}

void CheckCharge(const nlohmann::json& body) {
  long long amount = body.at("amount_cents").get<long long>();
  Check(amount >= 1 && amount <= idemsaga::steps::kMaxAmountCents);
  Check(body.at("currency").is_string() && body.at("payment_method").is_string());
}

// What the shipping participant reads without checking again.
void CheckShipment(const nlohmann::json& body) {
  Check(body.at("reservation_id").is_string());
  const auto& address = body.at("address");
  for (const char* field : {"name", "line1", "city", "postal_code"}) {
    Check(address.at(field).is_string() && !address.at(field).get<std::string>().empty());
  }
  Check(address.at("country").get<std::string>().size() == 2);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto body = nlohmann::json::parse(reinterpret_cast<const char*>(data),
                                    reinterpret_cast<const char*>(data) + size, nullptr, false);
  if (body.is_discarded()) return 0;  // the route's 400 invalid_json
  if (idemsaga::steps::ValidateOrder(body).empty()) {
    Check(body.is_object());
    CheckItems(body);
    CheckCharge(body);
  }
  if (idemsaga::steps::ValidateReservation(body).empty()) CheckItems(body);
  if (idemsaga::steps::ValidateCharge(body).empty()) CheckCharge(body);
  if (idemsaga::steps::ValidateShipment(body).empty()) CheckShipment(body);
  return 0;
}
