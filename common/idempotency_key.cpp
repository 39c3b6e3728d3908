#include "common/idempotency_key.hpp"

namespace common {
namespace {

ParsedKey Invalid(std::string message) {
  return ParsedKey{"", "idempotency_key_invalid", std::move(message)};
}

bool IsPrintable(char c) { return c >= 0x20 && c <= 0x7e; }

}  // namespace

ParsedKey ParseIdempotencyKey(bool present, std::string_view value, size_t max_length) {
  if (!present) {
    return ParsedKey{"", "idempotency_key_missing", "the Idempotency-Key header is required"};
  }
  std::string key;
  if (value.size() >= 2 && value.front() == '"') {
    if (value.back() != '"') return Invalid("unterminated quoted Idempotency-Key");
    for (size_t i = 1; i + 1 < value.size(); ++i) {
      char c = value[i];
      if (c == '\\') {
        if (i + 2 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
          return Invalid("bad escape in quoted Idempotency-Key");
        }
        c = value[++i];
      } else if (c == '"') {
        return Invalid("unescaped quote in Idempotency-Key");
      }
      key.push_back(c);
    }
  } else {
    key.assign(value);
  }
  if (key.empty()) return Invalid("the Idempotency-Key must not be empty");
  if (key.size() > max_length) {
    return Invalid("the Idempotency-Key is longer than " + std::to_string(max_length) +
                   " characters");
  }
  for (char c : key) {
    if (!IsPrintable(c)) return Invalid("the Idempotency-Key must be printable ASCII");
  }
  return ParsedKey{std::move(key), "", ""};
}

bool IsValidTenantId(std::string_view tenant) {
  if (tenant.empty() || tenant.size() > 64) return false;
  for (char c : tenant) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace common
