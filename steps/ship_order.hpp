// The shipping saga: reserve stock, charge, then create a shipment of the reservation to the
// customer's address; a refused address (422 address_unserviceable) refunds and releases, in
// that order. It is also docs/sagas.md's "Define your own saga" example, compiled as written.
//
// The participants must outlive the definition. Thread-safe to run concurrently.
//   registry.Add(steps::MakeShipOrderSaga(participants));
#pragma once

#include <nlohmann/json.hpp>

#include "steps/client/participants.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::steps {

// The saga's input, parsed once at the route (POST /v1/runs/ship_order).
struct ShipOrder {
  nlohmann::json items;    // [{"sku", "quantity"}], as the inventory step takes them
  nlohmann::json charge;   // {"amount_cents", "currency", "customer_id", "payment_method"}
  nlohmann::json address;  // {"name", "line1", "city", "postal_code", "country"}
};

// Throws saga::InvalidInput naming the field.
ShipOrder ParseShipOrder(const nlohmann::json& body);

// Version 1 calls the participant "shipping" over HTTP; version 2 calls "shipping_queue", the
// same participant reached through its command queue (orchestrator/amqp/step_queue.hpp).
saga::Definition MakeShipOrderSaga(idemsaga::Participants& participants, int version = 1);

}  // namespace idemsaga::steps
