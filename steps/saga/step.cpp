#include "steps/saga/step.hpp"

#include <stdexcept>

#include "steps/saga/definition.hpp"

namespace idemsaga {

const char* ToString(Outcome o) {
  switch (o) {
    case Outcome::kSucceeded:
      return "succeeded";
    case Outcome::kRetryable:
      return "retryable";
    case Outcome::kTerminal:
      return "terminal";
    case Outcome::kInDoubt:
      return "in_doubt";
    case Outcome::kBlocked:
      return "blocked";
  }
  return "unknown";
}

StepResult StepResult::Succeeded(nlohmann::json output, bool replayed) {
  StepResult r;
  r.outcome = Outcome::kSucceeded;
  r.output = std::move(output);
  r.replayed = replayed;
  return r;
}

StepResult StepResult::Retryable(std::string detail, int http_status) {
  StepResult r;
  r.outcome = Outcome::kRetryable;
  r.detail = std::move(detail);
  r.http_status = http_status;
  return r;
}

StepResult StepResult::Terminal(int http_status, std::string error_code, std::string detail) {
  StepResult r;
  r.outcome = Outcome::kTerminal;
  r.http_status = http_status;
  r.error_code = std::move(error_code);
  r.detail = std::move(detail);
  return r;
}

StepResult StepResult::InDoubt(std::string detail) {
  StepResult r;
  r.outcome = Outcome::kInDoubt;
  r.detail = std::move(detail);
  return r;
}

StepResult StepResult::Blocked(int http_status, std::string detail) {
  StepResult r;
  r.outcome = Outcome::kBlocked;
  r.http_status = http_status;
  r.detail = std::move(detail);
  return r;
}

const nlohmann::json& StepContext::Output(std::string_view name) const {
  static const nlohmann::json kNone;
  if (outputs == nullptr) return kNone;
  auto it = outputs->find(name);
  return it == outputs->end() ? kNone : *it;
}

std::shared_ptr<const std::any> StepContext::TypedOutput(std::string_view name) const {
  const StepDefinition* def = nullptr;
  if (steps != nullptr) {
    for (const auto& s : *steps) {
      if (s.name == name) def = &s;
    }
  }
  if (def == nullptr || !def->parse_output) {
    throw std::logic_error("step '" + std::string(name) + "' declares no output type");
  }
  const auto& output = Output(name);
  if (output.is_null()) {
    throw std::out_of_range("step '" + std::string(name) +
                            "' has no output (it has not succeeded)");
  }
  return def->parse_output(output);
}

std::string TraceContext::Traceparent() const {
  return "00-" + trace_id + "-" + parent_span_id + "-01";
}

}  // namespace idemsaga
