#include "common/idempotency_key.hpp"

#include "common/crypto.hpp"

namespace idemsaga::common {
namespace {

ParsedKey Invalid(std::string message) {
  return ParsedKey{"", "idempotency_key_invalid", std::move(message)};
}

bool IsPrintable(char c) { return c >= 0x20 && c <= 0x7e; }

// RFC 8941 §4.2.5: the body of a quoted sf-string, unescaped; nullopt-like "" + error.
ParsedKey ParseQuoted(std::string_view value) {
  std::string key;
  size_t i = 1;
  for (; i < value.size(); ++i) {
    char c = value[i];
    if (c == '"') break;
    if (c == '\\') {
      if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
        return Invalid("bad escape in the quoted Idempotency-Key (only \\\" and \\\\)");
      }
      c = value[++i];
    } else if (!IsPrintable(c)) {
      return Invalid("the Idempotency-Key must be printable ASCII");
    }
    key.push_back(c);
  }
  if (i >= value.size()) return Invalid("unterminated quoted Idempotency-Key");
  if (i + 1 != value.size()) {
    return Invalid(
        "the Idempotency-Key must be a single sf-string: no list, parameters or trailing data");
  }
  return ParsedKey{std::move(key), "", ""};
}

}  // namespace

ParsedKey ParseIdempotencyKey(size_t header_lines, std::string_view value, size_t max_length) {
  if (header_lines == 0) {
    return ParsedKey{"", "idempotency_key_missing", "the Idempotency-Key header is required"};
  }
  if (header_lines > 1) return Invalid("the Idempotency-Key header must be sent once");
  ParsedKey parsed;
  if (!value.empty() && value.front() == '"') {
    parsed = ParseQuoted(value);
    if (!parsed.ok()) return parsed;
  } else {
    if (value.find_first_of("\",;") != std::string_view::npos) {
      return Invalid(
          "a bare Idempotency-Key may not contain '\"', ',' or ';' (a list or parameters are not "
          "a key); quote it as an sf-string");
    }
    if (!value.empty() && (value.front() == ' ' || value.back() == ' ')) {
      return Invalid("a bare Idempotency-Key may not start or end with a space; quote it");
    }
    parsed.key.assign(value);
  }
  if (parsed.key.empty()) return Invalid("the Idempotency-Key must not be empty");
  if (parsed.key.size() > max_length) {
    return Invalid("the Idempotency-Key is longer than " + std::to_string(max_length) +
                   " characters");
  }
  if (!IsValidKeyBytes(parsed.key, max_length)) {
    return Invalid("the Idempotency-Key must be printable ASCII");
  }
  return parsed;
}

bool IsValidKeyBytes(std::string_view key, size_t max_length) {
  if (key.empty() || key.size() > max_length) return false;
  for (char c : key) {
    if (!IsPrintable(c)) return false;
  }
  return true;
}

std::string FormatIdempotencyKey(std::string_view key) {
  std::string out;
  out.reserve(key.size() + 2);
  out.push_back('"');
  for (char c : key) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
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

std::string RequestFingerprint(std::string_view method, std::string_view path,
                               const nlohmann::json& body) {
  std::string data;
  data.reserve(method.size() + path.size() + 64);
  data.append(method).append("\n").append(path).append("\n").append(body.dump());
  return Sha256Hex(data);
}

}  // namespace idemsaga::common
