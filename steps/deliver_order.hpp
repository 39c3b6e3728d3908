// The delivery saga: the order saga (place_order, the latest version, 3-D Secure included) run
// as a child under "A-order", then, for an order over kDeliveryApprovalOverCents, an
// operator's approval (the event order_approved or order_rejected, parked until it comes or
// the approval timeout passes), then a shipment of its reservation ("A-shipping"). A refused
// address (422 address_unserviceable), a rejection or no decision in time compensates the
// child: the charge refunded (or the authorisation voided), the stock released. The order's keys
// are the child's: "A-order-inventory", "A-order-payment", "A-order-capture"; its events are this
// saga's (POST /v1/runs/deliver_order/A/events/payment_confirmed).
//
// The participants must outlive the definition. Thread-safe to run concurrently.
//   registry.Add(steps::MakeDeliverOrderSaga(participants));
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>

#include "steps/client/participants.hpp"
#include "steps/place_order.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::steps {

// The saga's input: {"order": the order as POST /v1/orders takes it, "address": ...}.
struct DeliverOrder {
  nlohmann::json order;
  nlohmann::json address;  // {"name", "line1", "city", "postal_code", "country"}
};

// Orders above this amount (in the currency's minor unit) wait for an operator's approval.
inline constexpr long long kDeliveryApprovalOverCents = 500'000;

struct DeliverOrderOptions {
  PlaceOrderOptions place_order;  // the child's
  // How long an order over the limit waits for the operator's decision.
  std::chrono::milliseconds approval_timeout{std::chrono::hours(48)};
};

// Throws saga::InvalidInput naming the field.
DeliverOrder ParseDeliverOrder(const nlohmann::json& body);

saga::Definition MakeDeliverOrderSaga(idemsaga::Participants& participants,
                                      const DeliverOrderOptions& options = {});

}  // namespace idemsaga::steps
