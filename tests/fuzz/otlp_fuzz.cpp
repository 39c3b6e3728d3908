// libFuzzer harness for the OTLP/HTTP JSON trace intake (idemsaga::common::trace::DecodeOtlp), fed
// the way POST /v1/traces feeds it (JSON parsed first; invalid JSON is a 400 before decoding).
// Beyond "no crash, no leak, no UB": every span it keeps can be stored (ids hex of the right
// length, text without NUL and bounded, start <= end, at most kMaxOtlpAttributes), and a
// refusal always names where.
// Built only with -DIDEMSAGA_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt has the commands).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/trace/otlp.hpp"
#include "common/trace/trace_context.hpp"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

bool Storable(const std::string& s) {
  return s.size() <= idemsaga::common::trace::kMaxOtlpText && s.find('\0') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto json = nlohmann::json::parse(reinterpret_cast<const char*>(data),
                                    reinterpret_cast<const char*>(data) + size, nullptr, false);
  if (json.is_discarded()) return 0;
  std::string error;
  auto decoded = idemsaga::common::trace::DecodeOtlp(json, error);
  if (!decoded) {
    Check(!error.empty());
    return 0;
  }
  Check(decoded->rejected == 0 || !decoded->error.empty());
  for (const auto& s : decoded->spans) {
    Check(idemsaga::common::trace::IsHexId(s.trace_id, 32) &&
          idemsaga::common::trace::IsHexId(s.span_id, 16));
    Check(s.parent_span_id.empty() || idemsaga::common::trace::IsHexId(s.parent_span_id, 16));
    Check(!s.name.empty() && Storable(s.name) && Storable(s.status_message));
    Check(s.start_unix_nano >= 0 && s.start_unix_nano <= s.end_unix_nano);
    Check(s.attributes.size() <= idemsaga::common::trace::kMaxOtlpAttributes);
    for (const auto& [k, v] : s.attributes) {
      Check(!k.empty() && Storable(k));
      if (const auto* text = std::get_if<std::string>(&v)) Check(Storable(*text));
    }
  }
  return 0;
}
