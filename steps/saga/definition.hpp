// The definition of a saga: see include/idemsaga/saga.hpp (steps/saga/step.hpp names it here).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "steps/saga/step.hpp"

namespace idemsaga::steps::saga {

// What a derived key was derived from: the exact inverse of ActionKey and CompensationKey. Exact
// because a step name has no '-' and is never "compensate" (IsValidStepName): the last segment
// is the step, or "compensate" after it. A child saga's run key is itself an action key, so the
// parent may in turn be a derived key.
struct DerivedKey {
  std::string parent;
  std::string step;
  bool compensation = false;
};
// nullopt for a key no step could have derived (no '-', an empty parent, a segment that is not
// a step name).
std::optional<DerivedKey> ParseDerivedKey(std::string_view key);

}  // namespace idemsaga::steps::saga
