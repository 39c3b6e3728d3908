// W3C Trace Context: the `traceparent` header (https://www.w3.org/TR/trace-context/).
// Pure functions; ids are lower-case hex.
//   auto ctx = ParseTraceparent(req.get_header_value("traceparent"));
//   std::string header = FormatTraceparent(ctx->trace_id, span_id);
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace idemsaga::common::trace {

struct TraceParent {
  std::string trace_id;   // 32 hex, not all zero
  std::string parent_id;  // 16 hex, not all zero
  bool sampled = true;
};

// nullopt for anything the spec says to ignore: version ff, wrong lengths, upper-case or
// non-hex ids, all-zero ids, a version-00 header with trailing data.
std::optional<TraceParent> ParseTraceparent(std::string_view header);

std::string FormatTraceparent(std::string_view trace_id, std::string_view span_id,
                              bool sampled = true);

std::string NewTraceId();  // 16 random bytes, hex
std::string NewSpanId();   // 8 random bytes, hex

bool IsHexId(std::string_view s, size_t length);  // lower-case hex, not all zero

}  // namespace idemsaga::common::trace
