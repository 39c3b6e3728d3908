// The `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header), both ways.
//
// The draft defines the value as an RFC 8941 sf-string Item (`"abc"`); most clients send the
// bare token (`abc`). Both are accepted and mean the same key. Anything that is not one Item
// is refused: a list (`a, b`), parameters (`"a";p=1`), or the header sent more than once.
// Keys are exact bytes: no decoding (percent or otherwise), no trimming inside quotes. Between
// services, keys always travel as sf-strings (FormatIdempotencyKey), which every hop parses
// back to the same bytes. Pure functions, thread-safe.
//   auto key = ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
//                                  req.get_header_value("Idempotency-Key"), 255);
//   if (!key.ok()) return Reject(400, key.error);
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace idemsaga::common {

// The longest key a participant's guard takes: a derived key ("<parent>-<step>-compensate")
// under an orchestrator's parent key of at most 200 bytes.
inline constexpr size_t kMaxDerivedKeyLength = 255;

struct ParsedKey {
  std::string key;      // the key's bytes (sf-string unescaped); empty on error
  std::string error;    // "" on success, else "idempotency_key_missing" or "..._invalid"
  std::string message;  // human-readable reason on error
  bool ok() const { return error.empty(); }
};

// `header_lines` is how many Idempotency-Key lines the request had (0: missing; more than one
// is refused). A key is 1..max_length printable ASCII characters (0x20..0x7e); in the quoted
// form `\"` and `\\` are the only escapes; a bare value may not contain `"`, `,` or `;`, nor
// start or end with a space.
ParsedKey ParseIdempotencyKey(size_t header_lines, std::string_view value, size_t max_length);

// True for 1..max_length printable ASCII characters: any key Parse accepts, as raw bytes (a key
// in a JSON body, or one decoded from a URL path).
bool IsValidKeyBytes(std::string_view key, size_t max_length);

// The sf-string form of `key` ("..." with `"` and `\` escaped): what every service sends.
std::string FormatIdempotencyKey(std::string_view key);

// What a key is bound to, the same at every layer (the orchestrator's parent key and each
// participant's guard): lower-case hex SHA-256 over the method, the path and the body as
// canonical JSON (keys sorted, no whitespace), so the same key sent to another route, or with
// a body that means something else, is a reuse (422).
std::string RequestFingerprint(std::string_view method, std::string_view path,
                               const nlohmann::json& body);

// Tenant ids travel in headers and name key scopes: 1..64 of [A-Za-z0-9_-].
bool IsValidTenantId(std::string_view tenant);

}  // namespace idemsaga::common
