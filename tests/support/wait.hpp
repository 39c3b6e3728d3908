// Waiting on a condition in tests: poll it until it holds or a deadline passes, so a test
// takes as long as the system needs and no longer (never a fixed sleep that is too short on
// a slow machine and wasted on a fast one).
//   ASSERT_TRUE(test_support::WaitFor([&] { return Count() == 1; }, std::chrono::seconds(10)));
#pragma once

#include <chrono>
#include <thread>

namespace test_support {

// True as soon as `condition()` is; false if it still is not at the deadline.
template <typename Condition>
bool WaitFor(Condition condition, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace test_support
