#include "steps/place_order.hpp"

#include "steps/order_schema.hpp"

namespace steps {

saga::Definition MakePlaceOrderSaga(client::ParticipantClient& inventory,
                                    client::ParticipantClient& payment) {
  return saga::Definition("place_order")
      .Input<nlohmann::json>([](const nlohmann::json& body) {
        if (auto problem = ValidateOrder(body); !problem.empty()) throw saga::InvalidInput(problem);
        return body;
      })
      .Step(
          "inventory",
          [&inventory](saga::StepContext& ctx) {
            return inventory.Post("/v1/reservations", ctx, {{"items", (*ctx.request)["items"]}});
          },
          [&inventory](saga::StepContext& ctx) {
            return inventory.Compensate("/v1/reservations/release", ctx);
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
          [&payment](saga::StepContext& ctx) { return payment.Compensate("/v1/refunds", ctx); });
}

}  // namespace steps
