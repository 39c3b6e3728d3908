// A saga declared in code: a name and an ordered list of steps, each an action and the
// compensation that undoes it. The runner does the mechanics (keys, retries, compensation in
// reverse, recording); a definition only says what each step does.
//
// Immutable once built; safe to share between threads.
//   auto def = saga::Definition("place_order")
//       .Step("inventory", reserve, release)
//       .Step("payment", charge, refund);
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "orchestrator/saga/step.hpp"

namespace saga {

using StepFn = std::function<StepResult(StepContext&)>;

struct StepDefinition {
  std::string name;
  StepFn action;
  StepFn compensation;
};

// Step names are 1..32 of [a-z0-9_]: they become key suffixes, and without '-' in them two
// different parent keys can never derive the same step key. "compensate" is reserved, since
// "A-inventory" + "-compensate" must not equal parent "A-inventory"'s step "compensate".
bool IsValidStepName(std::string_view name);

// "A" + "inventory" -> "A-inventory".
std::string ActionKey(std::string_view parent_key, std::string_view step);
// "A" + "inventory" -> "A-inventory-compensate".
std::string CompensationKey(std::string_view parent_key, std::string_view step);

class Definition {
 public:
  explicit Definition(std::string name);

  // Throws std::invalid_argument for a bad or duplicate name, or a missing callable.
  Definition& Step(std::string name, StepFn action, StepFn compensation);

  const std::string& name() const { return name_; }
  const std::vector<StepDefinition>& steps() const { return steps_; }

 private:
  std::string name_;
  std::vector<StepDefinition> steps_;
};

}  // namespace saga
