// What every way into a service reads off a request before it acts on it, with no wire
// format in it: the JSON body (its media type, size and depth) and the bearer token of an
// `Authorization` value. The HTTP server (common/http) and the AMQP intake both read their
// requests with these, so one request refused over either says the same.
//
// Pure functions; thread-safe.
//   auto body = common::ReadJsonBody(content_type, bytes, {.max_bytes = 65536, .max_depth = 16});
//   if (!body.value) return Refuse(body.refusal.status, body.refusal.code, body.refusal.detail);
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace idemsaga::common {

// Why a request's input was refused before anything was stored: a status and a problem code
// (common/http/problem.hpp) with its detail.
struct InputRefusal {
  int status = 400;
  std::string code;
  std::string detail;
};

struct JsonLimits {
  size_t max_bytes = 64 * 1024;
  int max_depth = 16;
};

// A string with U+0000 anywhere (which no store takes) is refused, unless the caller checks
// each field itself (kCallerChecksFields: the OTLP intake refuses such a span alone).
enum class NulInJson { kRefuse, kCallerChecksFields };

struct JsonBody {
  std::optional<nlohmann::json> value;  // set when the body was accepted
  InputRefusal refusal;                 // otherwise: 415, 413 or 400 invalid_json
};

// Parses `body` as JSON once, when `content_type` is application/json (parameters and case
// aside) and it is within `limits`.
JsonBody ReadJsonBody(std::string_view content_type, std::string_view body,
                      const JsonLimits& limits, NulInJson nul = NulInJson::kRefuse);

// The token of an `Authorization: Bearer <token>` value (the scheme in any case, RFC 9110
// §11.1), or "" when absent or malformed.
std::string BearerTokenOf(std::string_view authorization);

}  // namespace idemsaga::common
