// Where a saga stands, as its parent row's `status` column stores it (V001's CHECK lists the
// same four names) and as every API shows it.
#pragma once

#include <optional>
#include <string_view>
#include <utility>

namespace idemsaga::orchestrator::store {

enum class SagaStatus {
  kStarted,       // running its actions (or deferred while a step is blocked)
  kCompensating,  // decided to fail; undoing what ran
  kCompleted,     // every action succeeded; the response is stored
  kFailed,        // compensated; the response is stored
};

// The one table between a status and its stored name.
inline constexpr std::pair<SagaStatus, const char*> kSagaStatusNames[] = {
    {SagaStatus::kStarted, "started"},
    {SagaStatus::kCompensating, "compensating"},
    {SagaStatus::kCompleted, "completed"},
    {SagaStatus::kFailed, "failed"},
};

constexpr const char* ToString(SagaStatus status) {
  for (const auto& [s, name] : kSagaStatusNames) {
    if (s == status) return name;
  }
  return "unknown";
}

// nullopt for a name that is not a status.
constexpr std::optional<SagaStatus> ParseSagaStatus(std::string_view name) {
  for (const auto& [s, n] : kSagaStatusNames) {
    if (name == n) return s;
  }
  return std::nullopt;
}

// Its response is stored: a retry replays it.
constexpr bool Finished(SagaStatus status) {
  return status == SagaStatus::kCompleted || status == SagaStatus::kFailed;
}

}  // namespace idemsaga::orchestrator::store
