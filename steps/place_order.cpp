#include "steps/place_order.hpp"

namespace steps {

saga::Definition MakePlaceOrderSaga(client::ParticipantClient& inventory,
                                    client::ParticipantClient& payment) {
  // action_applied: the participant must not take a missing record for "never arrived".
  auto undo = [](saga::StepContext& ctx) {
    return nlohmann::json{{"action_key", ctx.action_key}, {"action_applied", ctx.action_confirmed}};
  };
  return saga::Definition("place_order")
      .Step(
          "inventory",
          [&inventory](saga::StepContext& ctx) {
            return inventory.Post("/v1/reservations", ctx, {{"items", (*ctx.request)["items"]}});
          },
          [&inventory, undo](saga::StepContext& ctx) {
            return inventory.Post("/v1/reservations/release", ctx, undo(ctx));
          })
      .Step(
          "payment",
          [&payment](saga::StepContext& ctx) {
            const auto& r = *ctx.request;
            return payment.Post("/v1/charges", ctx,
                                {{"amount_cents", r["amount_cents"]},
                                 {"currency", r["currency"]},
                                 {"customer_id", r["customer_id"]},
                                 {"payment_method", r["payment_method"]}});
          },
          [&payment, undo](saga::StepContext& ctx) {
            return payment.Post("/v1/refunds", ctx, undo(ctx));
          });
}

}  // namespace steps
