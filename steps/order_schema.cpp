#include "steps/order_schema.hpp"

#include <set>
#include <string_view>

namespace idemsaga::steps {
namespace {

bool AllOf(const std::string& s, size_t max, bool (*ok)(char)) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!ok(c)) return false;
  }
  return true;
}

bool SkuChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}
bool UpperChar(char c) { return c >= 'A' && c <= 'Z'; }
bool VisibleChar(char c) { return c > 0x20 && c < 0x7f; }
bool MethodChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }
bool HexChar(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
// Any UTF-8 text but control characters (the parser has already refused invalid UTF-8).
bool TextChar(char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; }
bool PostalChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == ' ' ||
         c == '-';
}

std::string UnknownField(const nlohmann::json& body, const std::set<std::string>& allowed,
                         const std::string& at = "") {
  for (const auto& [name, _] : body.items()) {
    if (!allowed.count(name)) return at + "unknown field '" + name + "'";
  }
  return "";
}

bool IntegerIn(const nlohmann::json& body, const char* field, long long lo, long long hi) {
  if (!body.contains(field)) return false;
  const auto& v = body[field];
  // is_number_integer excludes 1e3 and 2.5; unsigned covers values above INT64_MAX.
  if (!v.is_number_integer()) return false;
  if (v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(hi)) {
    return false;
  }
  auto n = v.get<long long>();
  return n >= lo && n <= hi;
}

bool StringOf(const nlohmann::json& body, const char* field, size_t max, bool (*ok)(char)) {
  return body.contains(field) && body[field].is_string() &&
         AllOf(body[field].get<std::string>(), max, ok);
}

std::string CheckItems(const nlohmann::json& body) {
  if (!body.contains("items") || !body["items"].is_array() || body["items"].empty() ||
      body["items"].size() > kMaxItems) {
    return "items must be an array of 1 to " + std::to_string(kMaxItems) + " entries";
  }
  for (size_t i = 0; i < body["items"].size(); ++i) {
    const auto& item = body["items"][i];
    std::string at = "items[" + std::to_string(i) + "]";
    if (!item.is_object()) return at + " must be an object";
    if (auto e = UnknownField(item, {"sku", "quantity"}, at + " has "); !e.empty()) return e;
    if (!StringOf(item, "sku", 64, SkuChar)) return at + ".sku must be 1-64 of [a-z0-9_-]";
    if (!IntegerIn(item, "quantity", 1, kMaxQuantity)) {
      return at + ".quantity must be an integer from 1 to " + std::to_string(kMaxQuantity);
    }
  }
  return "";
}

std::string CheckCharge(const nlohmann::json& body) {
  if (!IntegerIn(body, "amount_cents", 1, kMaxAmountCents)) {
    return "amount_cents must be an integer from 1 to " + std::to_string(kMaxAmountCents);
  }
  if (!StringOf(body, "currency", 3, UpperChar) ||
      body["currency"].get<std::string>().size() != 3) {
    return "currency must be a three-letter upper-case ISO 4217 code";
  }
  if (!StringOf(body, "customer_id", 64, VisibleChar)) {
    return "customer_id must be 1-64 printable characters without spaces";
  }
  if (!StringOf(body, "payment_method", 64, MethodChar)) {
    return "payment_method must be 1-64 of [a-z0-9_]";
  }
  return "";
}

// Ids the participants make: a prefix ("res_", "ch_") and 32 lower-case hex digits.
std::string CheckId(const nlohmann::json& body, const std::string& field, std::string_view prefix) {
  constexpr size_t kHexDigits = 32;
  bool ok = body.contains(field) && body[field].is_string();
  if (ok) {
    const auto& id = body[field].get_ref<const std::string&>();
    ok = id.size() == prefix.size() + kHexDigits && id.starts_with(prefix) &&
         AllOf(id.substr(prefix.size()), kHexDigits, HexChar);
  }
  return ok ? ""
            : field + " must be " + std::string(prefix) + " followed by 32 lower-case hex digits";
}

std::string CheckReservationId(const nlohmann::json& body) {
  return CheckId(body, "reservation_id", "res_");
}

}  // namespace

std::string ValidateReservation(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  if (auto e = UnknownField(body, {"items"}); !e.empty()) return e;
  return CheckItems(body);
}

std::string ValidateCapture(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  if (auto e = UnknownField(body, {"charge_id"}); !e.empty()) return e;
  return CheckId(body, "charge_id", "ch_");
}

std::string ValidateCharge(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  if (auto e = UnknownField(
          body, {"amount_cents", "currency", "customer_id", "payment_method", "three_d_secure"});
      !e.empty()) {
    return e;
  }
  if (body.contains("three_d_secure") && !body["three_d_secure"].is_boolean()) {
    return "three_d_secure must be true or false";
  }
  return CheckCharge(body);
}

std::string ValidateShipment(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  if (auto e = UnknownField(body, {"reservation_id", "address"}); !e.empty()) return e;
  if (auto e = CheckReservationId(body); !e.empty()) return e;
  if (!body.contains("address")) return "address must be an object";
  return ValidateAddress(body["address"], "address.");
}

std::string ValidateAddress(const nlohmann::json& address, const std::string& at) {
  // "address." names the object "address"; "" names it "the address".
  const std::string self =
      at.empty() ? "the address" : at.substr(0, at.size() - (at.back() == '.' ? 1 : 0));
  if (!address.is_object()) return self + " must be an object";
  if (auto e = UnknownField(address, {"name", "line1", "city", "postal_code", "country"},
                            self + " has ");
      !e.empty()) {
    return e;
  }
  for (const char* field : {"name", "line1", "city"}) {
    if (!StringOf(address, field, kMaxAddressText, TextChar)) {
      return at + field + " must be 1-" + std::to_string(kMaxAddressText) +
             " bytes of text without control characters";
    }
  }
  if (!StringOf(address, "postal_code", kMaxPostalCode, PostalChar)) {
    return at + "postal_code must be 1-" + std::to_string(kMaxPostalCode) + " of [A-Za-z0-9 -]";
  }
  if (!StringOf(address, "country", 2, UpperChar) ||
      address["country"].get_ref<const std::string&>().size() != 2) {
    return at + "country must be a two-letter upper-case ISO 3166-1 code";
  }
  return "";
}

std::string ValidateOrder(const nlohmann::json& body) {
  if (!body.is_object()) return "the body must be a JSON object";
  if (auto e = UnknownField(body,
                            {"items", "amount_cents", "currency", "customer_id", "payment_method"});
      !e.empty()) {
    return e;
  }
  if (auto e = CheckItems(body); !e.empty()) return e;
  return CheckCharge(body);
}

}  // namespace idemsaga::steps
