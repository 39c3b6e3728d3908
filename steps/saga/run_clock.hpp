// What the runner's source files share (internal to steps/saga): the clocks' units.
#pragma once

#include <chrono>

namespace idemsaga::steps::saga::detail {

using Clock = std::chrono::steady_clock;

inline std::chrono::system_clock::time_point FromUnixMs(long long ms) {
  return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
}

inline long long ToUnixMs(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
}  // namespace idemsaga::steps::saga::detail
