// libFuzzer harness for the Idempotency-Key header parser and its sf-string formatter. Beyond
// "no crash, no leak, no UB" it checks the promises every hop relies on:
//   - an accepted key is 1..max printable ASCII bytes (so it fits the key tables' CHECKs);
//   - formatting an accepted key and parsing it again gives the same bytes (the round trip
//     between the orchestrator and its participants);
//   - a refusal says which: missing or invalid, with a message.
// Built only with -DIDEMSAGA_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt has the commands).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/idempotency_key.hpp"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view value(reinterpret_cast<const char*>(data), size);
  for (size_t max : {size_t{200}, size_t{255}}) {
    auto parsed = idemsaga::common::ParseIdempotencyKey(1, value, max);
    if (!parsed.ok()) {
      Check(parsed.error == "idempotency_key_invalid" && !parsed.message.empty());
      continue;
    }
    Check(idemsaga::common::IsValidKeyBytes(parsed.key, max));
    auto again = idemsaga::common::ParseIdempotencyKey(
        1, idemsaga::common::FormatIdempotencyKey(parsed.key), max);
    Check(again.ok() && again.key == parsed.key);
  }
  Check(idemsaga::common::ParseIdempotencyKey(2, value, 255).error == "idempotency_key_invalid");
  return 0;
}
