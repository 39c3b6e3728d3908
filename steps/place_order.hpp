// The order saga: reserve stock (inventory), then charge (payment); compensations release the
// stock and refund the charge. Step names become key suffixes: "A-inventory", "A-payment".
//
// The clients must outlive the definition. Thread-safe to run concurrently.
//   auto def = steps::MakePlaceOrderSaga(inventory_client, payment_client);
#pragma once

#include "orchestrator/saga/definition.hpp"
#include "steps/client/participant_client.hpp"

namespace steps {

saga::Definition MakePlaceOrderSaga(client::ParticipantClient& inventory,
                                    client::ParticipantClient& payment);

}  // namespace steps
