// The order saga: reserve stock (inventory), then charge (payment); compensations release the
// stock and refund the charge. Step names become key suffixes: "A-inventory", "A-payment".
// Its input is the order as POST /v1/orders takes it (ValidateOrder).
//
// The clients must outlive the definition. Thread-safe to run concurrently.
//   registry.Add(steps::MakePlaceOrderSaga(participants.Get("inventory"),
//   participants.Get("payment")));
#pragma once

#include "steps/client/participant_client.hpp"
#include "steps/saga/definition.hpp"

namespace steps {

saga::Definition MakePlaceOrderSaga(client::ParticipantClient& inventory,
                                    client::ParticipantClient& payment);

}  // namespace steps
