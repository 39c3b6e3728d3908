// A saga declared in code: a name, a version, a typed input and an ordered list of steps,
// each an action and the compensation that undoes it, with an optional policy of its own. The
// runner does the mechanics (derived keys, retries, compensation in reverse, recording and
// persisting outputs); a definition only says what each step does.
//
// Immutable once built; safe to share between threads.
//   auto def = saga::Definition("ship_order", /*version=*/1)
//       .Input<ShipOrder>(ParseShipOrder)
//       .Step("inventory", reserve, release)
//       .Step("shipping", ship, cancel, {.call_timeout = std::chrono::seconds(2)});
#pragma once

#include <any>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "steps/saga/step.hpp"

namespace saga {

using StepFn = std::function<StepResult(StepContext&)>;

// What one step overrides of the runner's RetryPolicy (runner.hpp); unset fields keep it.
struct StepPolicy {
  std::optional<int> max_attempts;  // per action, the first included
  std::optional<std::chrono::milliseconds> initial_backoff;
  std::optional<std::chrono::milliseconds> max_backoff;
  // No new action attempt after this; the client answers 202 long before.
  std::optional<std::chrono::milliseconds> step_deadline;
  // Each call's own limit (ctx.call_timeout), below the participant client's read timeout.
  std::optional<std::chrono::milliseconds> call_timeout;
  std::optional<int> compensation_stuck_after;
};

struct StepDefinition {
  std::string name;
  StepFn action;
  StepFn compensation;
  StepPolicy policy;
};

// The input broke a rule; what() names the field ("address.country must be ...").
class InvalidInput : public std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Saga and step names are 1..32 of [a-z0-9_]: step names become key suffixes, and without '-'
// in them two different parent keys can never derive the same step key. "compensate" is
// reserved, since "A-inventory" + "-compensate" must not equal parent "A-inventory"'s step
// "compensate".
bool IsValidStepName(std::string_view name);

// "A" + "inventory" -> "A-inventory".
std::string ActionKey(std::string_view parent_key, std::string_view step);
// "A" + "inventory" -> "A-inventory-compensate".
std::string CompensationKey(std::string_view parent_key, std::string_view step);

class Definition {
 public:
  // Throws std::invalid_argument for a bad name or a version below 1.
  explicit Definition(std::string name, int version = 1);

  // The input's type: `parse` turns the request body into a T, or throws InvalidInput naming
  // the field (saga::Fields makes that short). Steps read it as ctx.Input<T>(). Without this,
  // the input is the JSON body as it came (ctx.Input<nlohmann::json>()).
  template <typename T>
  Definition& Input(std::function<T(const nlohmann::json&)> parse) {
    parse_ = [parse = std::move(parse)](const nlohmann::json& body) {
      return std::make_shared<const std::any>(parse(body));
    };
    return *this;
  }

  // Throws std::invalid_argument for a bad or duplicate name, or a missing callable.
  Definition& Step(std::string name, StepFn action, StepFn compensation, StepPolicy policy = {});

  // The typed input of `body`; throws InvalidInput.
  std::shared_ptr<const std::any> ParseInput(const nlohmann::json& body) const;

  const std::string& name() const { return name_; }
  int version() const { return version_; }
  const std::vector<StepDefinition>& steps() const { return steps_; }

 private:
  std::string name_;
  int version_;
  std::function<std::shared_ptr<const std::any>(const nlohmann::json&)> parse_;
  std::vector<StepDefinition> steps_;
};

}  // namespace saga
