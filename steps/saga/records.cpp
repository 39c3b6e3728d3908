// What a run records and how it is stored: step statuses and their names, StepRecord's JSON
// and a stored failure's, the order compensations run in, and how a run ends (runner.hpp).
#include <algorithm>
#include <stdexcept>

#include "steps/saga/runner.hpp"

namespace idemsaga::steps::saga {

std::vector<size_t> UndoOrder(const std::vector<StepRecord>& steps, const Definition* definition) {
  static const std::vector<StepDefinition> kNone;
  const auto& defs = definition != nullptr ? definition->steps() : kNone;
  std::vector<std::pair<std::pair<size_t, int>, size_t>> keyed;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool branch = i < defs.size() && defs[i].name == steps[i].name && defs[i].group >= 0;
    const size_t block = branch ? static_cast<size_t>(defs[i].group) : i;
    const int within = branch && steps[i].finish_order == 0 ? 1 << 30 : steps[i].finish_order;
    keyed.push_back({{block, within}, i});
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<size_t> order;
  order.reserve(keyed.size());
  for (const auto& [key, i] : keyed) order.push_back(i);
  return order;
}

namespace {

// The one table between a step status and its stored name.
constexpr std::pair<StepStatus, const char*> kStepStatusNames[] = {
    {StepStatus::kNotRun, "not_run"},
    {StepStatus::kSucceeded, "succeeded"},
    {StepStatus::kFailed, "failed"},
    {StepStatus::kInDoubt, "in_doubt"},
    {StepStatus::kCompensating, "compensating"},
    {StepStatus::kCompensated, "compensated"},
    {StepStatus::kWaiting, "waiting"},
    {StepStatus::kSkipped, "skipped"},
};

}  // namespace

const char* ToString(StepStatus status) {
  for (const auto& [s, name] : kStepStatusNames) {
    if (s == status) return name;
  }
  return "unknown";
}

std::optional<StepStatus> ParseStepStatus(std::string_view name) {
  for (const auto& [s, n] : kStepStatusNames) {
    if (name == n) return s;
  }
  return std::nullopt;
}

nlohmann::json StepRecord::ToJson() const {
  nlohmann::json j = {{"name", name},
                      {"action_key", action_key},
                      {"status", ToString(status)},
                      {"attempts", attempts},
                      {"compensation_attempts", compensation_attempts},
                      {"replayed", replayed},
                      {"action_confirmed", action_confirmed}};
  if (!output.is_null()) j["output"] = output;
  if (!detail.empty()) j["detail"] = detail;
  if (first_attempt_unix_ms != 0) j["first_attempt_unix_ms"] = first_attempt_unix_ms;
  if (maybe_applied) j["maybe_applied"] = true;
  if (finish_order != 0) j["finish_order"] = finish_order;
  return j;
}

StepRecord StepRecord::FromJson(const nlohmann::json& j) {
  StepRecord r;
  r.name = j.value("name", "");
  r.action_key = j.value("action_key", "");
  std::string status = j.value("status", "not_run");
  auto parsed = ParseStepStatus(status);
  if (!parsed)
    throw std::invalid_argument("step '" + r.name + "' has unknown status '" + status + "'");
  r.status = *parsed;
  r.attempts = j.value("attempts", 0);
  r.compensation_attempts = j.value("compensation_attempts", 0);
  r.replayed = j.value("replayed", false);
  r.action_confirmed = j.value("action_confirmed", false);
  if (j.contains("output")) r.output = j["output"];
  r.detail = j.value("detail", "");
  r.first_attempt_unix_ms = j.value("first_attempt_unix_ms", 0LL);
  r.maybe_applied = j.value("maybe_applied", false);
  r.finish_order = j.value("finish_order", 0);
  return r;
}

nlohmann::json ToJson(const std::vector<StepRecord>& steps) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : steps) j.push_back(s.ToJson());
  return j;
}

nlohmann::json FailureToJson(const StepResult& failure) {
  return {{"outcome", ToString(failure.outcome)},
          {"http_status", failure.http_status},
          {"error_code", failure.error_code},
          {"detail", failure.detail}};
}

StepResult FailureFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return StepResult::Retryable("unknown");
  if (j.value("outcome", "") == ToString(Outcome::kTerminal)) {
    return StepResult::Terminal(j.value("http_status", 0), j.value("error_code", ""),
                                j.value("detail", ""));
  }
  auto r = StepResult::InDoubt(j.value("detail", ""));
  r.http_status = j.value("http_status", 0);
  return r;
}

StepResult CancelledByOperator() {
  return StepResult::Terminal(409, "saga_cancelled",
                              "an operator cancelled this saga; the steps that ran were "
                              "compensated");
}

const char* ToString(SagaEnd end) {
  switch (end) {
    case SagaEnd::kCompleted:
      return "completed";
    case SagaEnd::kFailed:
      return "failed";
    case SagaEnd::kFenced:
      return "fenced";
    case SagaEnd::kAbandoned:
      return "abandoned";
    case SagaEnd::kDeferred:
      return "deferred";
    case SagaEnd::kParked:
      return "parked";
  }
  return "unknown";
}

}  // namespace idemsaga::steps::saga
