// What the test kit's source files share (internal to testing/): the world one environment's
// participants, journal and clock share, and the crash that unwinds a run.
#pragma once

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "idemsaga/testing.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::testing {

using std::chrono::milliseconds;

// Thrown at a crash point: not a std::exception, so that neither a step's call (Call counts a
// std::exception as in doubt) nor anything else in the engine takes it for an answer. It
// unwinds the run as a kill -9 ends it: nothing more is written or sent.
struct Crashed {};

// What one environment's participants, journal and clock share, under one mutex.
struct detail::World {
  std::mutex mu;
  long long start_ms = 0;
  long long now_ms = 0;
  std::vector<Call> calls;

  // Crash points: counted through the run; the run dies at the crash_at-th (0: never).
  int crash_at = 0;
  int points = 0;
  std::vector<std::string> where;
  bool crashed = false;
  std::string last_key;  // of the last call, to name a boundary

  // Events: delivered (kept, the first of a name wins), and scheduled for a virtual time.
  std::vector<steps::saga::ReceivedEvent> delivered;
  std::vector<std::pair<long long, steps::saga::ReceivedEvent>> scheduled;

  void DeliverLocked(const std::string& name, nlohmann::json payload) {
    for (const auto& e : delivered) {
      if (e.name == name) return;
    }
    delivered.push_back({name, std::move(payload)});
  }
  void AdvanceLocked(milliseconds d) {
    if (d.count() > 0) now_ms += d.count();
    // Delivered in the order they fall due (stable for equal times: the order sent).
    std::stable_sort(scheduled.begin(), scheduled.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    while (!scheduled.empty() && scheduled.front().first <= now_ms) {
      DeliverLocked(scheduled.front().second.name, scheduled.front().second.payload);
      scheduled.erase(scheduled.begin());
    }
  }
  void AliveLocked() const {
    if (crashed) throw Crashed{};
  }
  void PointLocked(std::string what) {
    ++points;
    where.push_back(std::move(what));
    if (crash_at == points) {
      crashed = true;
      throw Crashed{};
    }
  }
};

// The checks' way into an environment's world (a friend of Environment).
struct CheckAccess {
  static detail::World& Of(Environment& env);
};

}  // namespace idemsaga::testing
