#include "steps/saga/definition.hpp"

#include <stdexcept>

namespace saga {

bool IsValidStepName(std::string_view name) {
  if (name.empty() || name.size() > 32 || name == "compensate") return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string ActionKey(std::string_view parent_key, std::string_view step) {
  return std::string(parent_key) + "-" + std::string(step);
}

std::string CompensationKey(std::string_view parent_key, std::string_view step) {
  return ActionKey(parent_key, step) + "-compensate";
}

Definition::Definition(std::string name, int version) : name_(std::move(name)), version_(version) {
  if (!IsValidStepName(name_)) {
    throw std::invalid_argument("saga name '" + name_ + "' must be 1-32 of [a-z0-9_]");
  }
  if (version_ < 1) throw std::invalid_argument("saga '" + name_ + "': version must be >= 1");
}

std::shared_ptr<const std::any> Definition::ParseInput(const nlohmann::json& body) const {
  if (!parse_) return std::make_shared<const std::any>(body);
  return parse_(body);
}

Definition& Definition::Step(std::string name, StepFn action, StepFn compensation,
                             StepPolicy policy) {
  if (!IsValidStepName(name)) {
    throw std::invalid_argument("step name '" + name +
                                "' must be 1-32 of [a-z0-9_] and not 'compensate'");
  }
  for (const auto& s : steps_) {
    if (s.name == name) throw std::invalid_argument("duplicate step name '" + name + "'");
  }
  if (!action || !compensation) {
    throw std::invalid_argument("step '" + name + "' needs an action and a compensation");
  }
  steps_.push_back({std::move(name), std::move(action), std::move(compensation), policy});
  return *this;
}

}  // namespace saga
