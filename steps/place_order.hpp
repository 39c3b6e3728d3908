// The order saga: reserve stock (inventory), then charge (payment); compensations release the
// stock and refund the charge. Step names become key suffixes: "A-inventory", "A-payment".
// Its input is the order as POST /v1/orders takes it (ValidateOrder).
//
// Version 2 (what new orders run) adds 3-D Secure: when the charge answers `requires_action`
// (a card that needs the card holder's confirmation, pm_card_3ds in the demo), the saga waits,
// parked, for the event `payment_confirmed` or `payment_failed`, then captures the charge
// ("A-capture"; compensated by a refund). A failure, or no event within the confirmation
// timeout, releases the stock and voids the authorisation. For any other card those two steps
// are skipped. Version 1 stays registered for orders that started with it. The same saga with
// the first two steps side by side is place_order_parallel.
//
// The clients must outlive the definition. Thread-safe to run concurrently.
//   registry.Add(steps::MakePlaceOrderSaga(participants.Get("inventory"),
//   participants.Get("payment")));
#pragma once

#include <chrono>

#include "steps/client/participant_client.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::steps {

struct PlaceOrderOptions {
  // How long an order paid by a card that needs 3-D Secure waits for the confirmation.
  std::chrono::milliseconds confirmation_timeout{std::chrono::minutes(15)};
};

// The order's steps, for sagas of your own built around them: reserve the order's items and
// release them; charge the order's amount and refund it. Each reads the order (ctx.request).
// `three_d_secure`: the saga waits for a card holder's confirmation when the charge answers
// `requires_action`; without it, a card that needs 3-D Secure is refused (402
// authentication_required), never left authorised.
saga::StepFn ReserveItems(idemsaga::ParticipantClient& inventory);
saga::StepFn ReleaseItems(idemsaga::ParticipantClient& inventory);
saga::StepFn ChargeOrder(idemsaga::ParticipantClient& payment, bool three_d_secure = false);
saga::StepFn RefundOrder(idemsaga::ParticipantClient& payment);

// The latest version (2).
saga::Definition MakePlaceOrderSaga(idemsaga::ParticipantClient& inventory,
                                    idemsaga::ParticipantClient& payment,
                                    const PlaceOrderOptions& options = {});
// place_order_parallel (version 1): version 2 with the stock reserved and the card charged side
// by side (POST /v1/runs/place_order_parallel takes the same order). An order refused by one
// of them may have been applied by the other, which is then undone: a refused card releases
// the stock, an item out of stock refunds the charge.
saga::Definition MakePlaceOrderParallelSaga(idemsaga::ParticipantClient& inventory,
                                            idemsaga::ParticipantClient& payment,
                                            const PlaceOrderOptions& options = {});
// Version 1: inventory, payment.
saga::Definition MakePlaceOrderSagaV1(idemsaga::ParticipantClient& inventory,
                                      idemsaga::ParticipantClient& payment);

}  // namespace idemsaga::steps
