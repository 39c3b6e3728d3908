// Fault injection for the demo participants, set by flags and at run time (PUT /admin/faults).
//
// - error_rate: answer 503 before doing anything (a transient failure; nothing stored)
// - fail_next: the next N requests answer 503 that way (deterministic, for tests and demos)
// - retry_after_s: the Retry-After those 503s carry (a long one makes callers park)
// - key_prefix: error_rate and fail_next apply only to requests whose Idempotency-Key starts
//   with it (a derived key starts with its parent's: one outage for some orders, not all)
// - drop_after_commit_rate: commit the effect, then drop the connection without an answer
//   (the caller is left in doubt and must retry with the same key)
// - latency_ms: delay every answer after its commit (drives callers into read timeouts)
// - hang: hold every new request, doing nothing, until the hang is cleared
// Thread-safe; all off by default.
#pragma once

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace idemsaga::demo {

struct FaultSettings {
  double error_rate = 0;
  int fail_next = 0;
  int retry_after_s = 1;
  std::string key_prefix;
  double drop_after_commit_rate = 0;
  int latency_ms = 0;
  bool hang = false;
};

// Parses and range-checks a settings object; on error returns nullopt and sets `error`.
std::optional<FaultSettings> ParseFaultSettings(const nlohmann::json& j, std::string& error);
nlohmann::json ToJson(const FaultSettings& s);

class Faults {
 public:
  explicit Faults(FaultSettings initial = {}) : settings_(initial) {}
  FaultSettings Get() const;
  void Set(const FaultSettings& s);

  // Whether the request with `key` is answered 503 now; nullopt: go on, else the
  // Retry-After to send (seconds).
  std::optional<int> Fail(std::string_view key);
  bool ShouldDropAfterCommit();
  void DelayAnswer() const;
  // Blocks while `hang` is set (or until Release()).
  void HoldWhileHung() const;
  // Lets every held request go (server shutdown).
  void Release() { released_ = true; }

 private:
  bool Roll(double rate);
  mutable std::mutex mutex_;
  FaultSettings settings_;
  std::atomic<bool> released_{false};
};

}  // namespace idemsaga::demo
