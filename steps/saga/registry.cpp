#include "steps/saga/registry.hpp"

#include <algorithm>
#include <stdexcept>

namespace idemsaga::steps::saga {

Registry& Registry::Add(Definition definition) {
  auto id = std::pair{definition.name(), definition.version()};
  if (definitions_.count(id)) {
    throw std::invalid_argument("saga '" + id.first + "' version " + std::to_string(id.second) +
                                " is registered twice");
  }
  definitions_.emplace(std::move(id), std::make_unique<const Definition>(std::move(definition)));
  return *this;
}

const Definition* Registry::Find(std::string_view name, int version) const {
  auto it = definitions_.find(std::pair{std::string(name), version});
  return it == definitions_.end() ? nullptr : it->second.get();
}

const Definition* Registry::Latest(std::string_view name) const {
  const Definition* latest = nullptr;
  for (const auto& [id, def] : definitions_) {
    if (id.first == name) latest = def.get();  // ascending versions: the last one wins
  }
  return latest;
}

std::vector<const Definition*> Registry::All() const {
  std::vector<const Definition*> out;
  for (const auto& [id, def] : definitions_) out.push_back(def.get());
  return out;
}

size_t Registry::MaxSteps() const {
  size_t most = 0;
  for (const auto& [id, def] : definitions_) most = std::max(most, def->steps().size());
  return most;
}

}  // namespace idemsaga::steps::saga
