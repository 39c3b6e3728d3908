#include "steps/ship_order.hpp"

#include "steps/order_schema.hpp"
#include "steps/saga/fields.hpp"

namespace idemsaga::steps {

ShipOrder ParseShipOrder(const nlohmann::json& body) {
  saga::Fields f(body);
  ShipOrder in{f.Raw("items"),
               {{"amount_cents", f.Raw("amount_cents")},
                {"currency", f.Raw("currency")},
                {"customer_id", f.Raw("customer_id")},
                {"payment_method", f.Raw("payment_method")}},
               f.Raw("address")};
  f.Done();
  // The participants' own wire rules, so that a run the route accepts is never refused by a
  // participant as malformed (which would leave it stuck, not failed).
  for (const auto& problem : {ValidateReservation({{"items", in.items}}), ValidateCharge(in.charge),
                              ValidateAddress(in.address, "address.")}) {
    if (!problem.empty()) throw saga::InvalidInput(problem);
  }
  return in;
}

// [define-your-own-saga]
saga::Definition MakeShipOrderSaga(idemsaga::Participants& participants, int version) {
  auto& inventory = participants.Get("inventory");
  auto& payment = participants.Get("payment");
  // Version 2 ships through the shipping participant's queue: the same step, another way in.
  auto& shipping = participants.Get(version == 1 ? "shipping" : "shipping_queue");
  using Ctx = saga::StepContext;
  return saga::Definition("ship_order", version)
      .Input<ShipOrder>(ParseShipOrder)
      .Step(
          "inventory",
          [&](Ctx& ctx) {
            return inventory.Post("/v1/reservations", ctx,
                                  {{"items", ctx.Input<ShipOrder>().items}});
          },
          [&](Ctx& ctx) { return inventory.Compensate("/v1/reservations/release", ctx); })
      .Step(
          "payment",
          [&](Ctx& ctx) { return payment.Post("/v1/charges", ctx, ctx.Input<ShipOrder>().charge); },
          [&](Ctx& ctx) { return payment.Compensate("/v1/refunds", ctx); })
      .Step(
          "shipping",
          [&](Ctx& ctx) {
            return shipping.Post("/v1/shipments", ctx,
                                 {{"reservation_id", ctx.Output("inventory").at("reservation_id")},
                                  {"address", ctx.Input<ShipOrder>().address}});
          },
          [&](Ctx& ctx) { return shipping.Compensate("/v1/shipments/cancel", ctx); },
          {.call_timeout = std::chrono::seconds(2)});
}
// [define-your-own-saga]

}  // namespace idemsaga::steps
