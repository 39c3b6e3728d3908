// The sagas the product ships, as factories over the configured participants: an
// orchestrator builds each one once, at start-up, into its saga::Registry.
//   for (const auto& make : steps::ShippedSagas()) registry.Add(make(participants));
#pragma once

#include <functional>
#include <vector>

#include "steps/client/participants.hpp"
#include "steps/saga/definition.hpp"

namespace steps {

using SagaFactory = std::function<saga::Definition(client::Participants&)>;

// place_order (inventory, payment) and ship_order (inventory, payment, shipping).
std::vector<SagaFactory> ShippedSagas();

}  // namespace steps
