// Parses an `Idempotency-Key` header value (IETF draft-ietf-httpapi-idempotency-key-header).
//
// The draft defines the value as a Structured Field sf-string (`"abc"`); most clients send the
// bare token (`abc`). Both are accepted and mean the same key. Pure function, thread-safe.
//   auto key = ParseIdempotencyKey(req.get_header_value("Idempotency-Key"), 255);
//   if (!key.ok()) return Reject(400, key.error);
#pragma once

#include <string>
#include <string_view>

namespace common {

struct ParsedKey {
  std::string key;      // the key without sf-string quotes; empty on error
  std::string error;    // "" on success, else "idempotency_key_missing" or "..._invalid"
  std::string message;  // human-readable reason on error
  bool ok() const { return error.empty(); }
};

// `present` is false when the header was absent. Keys are 1..max_length printable ASCII
// characters (0x20..0x7e); in the quoted form, `\"` and `\\` escapes are decoded.
ParsedKey ParseIdempotencyKey(bool present, std::string_view value, size_t max_length);

// Tenant ids travel in headers and name key scopes: 1..64 of [A-Za-z0-9_-].
bool IsValidTenantId(std::string_view tenant);

}  // namespace common
