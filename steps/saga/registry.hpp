// The sagas one orchestrator serves, by name and version. A parent row records the name and
// version its saga started with, and a resumed saga runs exactly that definition; a new
// request runs the latest version of its name.
//
// Fill it before serving, then share it read-only between threads.
//   saga::Registry registry;
//   registry.Add(MakeShipOrderSaga(participants));
//   const saga::Definition* def = registry.Latest("ship_order");
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "steps/saga/definition.hpp"

namespace idemsaga::steps::saga {

class Registry {
 public:
  // Throws std::invalid_argument when this name and version are registered already.
  Registry& Add(Definition definition);

  // nullptr when not registered (a build that dropped the definition a saga started with).
  const Definition* Find(std::string_view name, int version) const;
  // The highest version of `name`; nullptr when none.
  const Definition* Latest(std::string_view name) const;
  // Every definition, by name, then version.
  std::vector<const Definition*> All() const;
  // The most steps any definition has (for retention arithmetic).
  size_t MaxSteps() const;
  bool empty() const { return definitions_.empty(); }

 private:
  std::map<std::pair<std::string, int>, std::unique_ptr<const Definition>, std::less<>>
      definitions_;
};

}  // namespace idemsaga::steps::saga
