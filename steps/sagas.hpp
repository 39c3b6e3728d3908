// The sagas the product ships, as factories over the configured participants: an
// orchestrator builds each one once, at start-up, into its saga::Registry.
//   for (const auto& make : steps::ShippedSagas())
//     if (auto saga = make(participants)) registry.Add(std::move(*saga));
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "steps/client/participants.hpp"
#include "steps/place_order.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::steps {

// Builds a saga over the configured participants; nullopt: it is not served by this
// orchestrator (an optional participant it needs is not configured). A factory that simply
// returns its saga::Definition fits, and one that calls an unconfigured participant throws
// std::out_of_range from Participants::Get.
using SagaFactory = idemsaga::SagaFactory;

// place_order (inventory, payment; versions 1 and 2, see place_order.hpp), its variant
// place_order_parallel (the two side by side), and, when a shipping participant is
// configured, ship_order (inventory, payment, shipping) and deliver_order (place_order as a
// child saga, then shipping).
std::vector<SagaFactory> ShippedSagas(const PlaceOrderOptions& place_order = {});

}  // namespace idemsaga::steps
