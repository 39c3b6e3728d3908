#include "common/trace/trace_context.hpp"

#include "common/crypto.hpp"

namespace common::trace {

bool IsHexId(std::string_view s, size_t length) {
  if (s.size() != length) return false;
  bool nonzero = false;
  for (char c : s) {
    bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (!hex) return false;
    nonzero = nonzero || c != '0';
  }
  return nonzero;
}

std::optional<TraceParent> ParseTraceparent(std::string_view h) {
  // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 characters.
  if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  std::string_view version = h.substr(0, 2);
  auto is_hex2 = [](std::string_view v) {
    for (char c : v) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
  };
  if (!is_hex2(version) || version == "ff") return std::nullopt;
  // Version 00 is exactly 55 characters; a later version may append fields after a '-'.
  if (version == "00" ? h.size() != 55 : (h.size() > 55 && h[55] != '-')) return std::nullopt;
  std::string_view flags = h.substr(53, 2);
  if (!is_hex2(flags)) return std::nullopt;
  TraceParent tp{std::string(h.substr(3, 32)), std::string(h.substr(36, 16)), false};
  if (!IsHexId(tp.trace_id, 32) || !IsHexId(tp.parent_id, 16)) return std::nullopt;
  tp.sampled = (std::stoi(std::string(flags), nullptr, 16) & 1) != 0;
  return tp;
}

std::string FormatTraceparent(std::string_view trace_id, std::string_view span_id, bool sampled) {
  return "00-" + std::string(trace_id) + "-" + std::string(span_id) + (sampled ? "-01" : "-00");
}

std::string NewTraceId() { return RandomHex(16); }
std::string NewSpanId() { return RandomHex(8); }

}  // namespace common::trace
