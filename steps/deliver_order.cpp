#include "steps/deliver_order.hpp"

#include "steps/order_schema.hpp"
#include "steps/saga/fields.hpp"

namespace idemsaga::steps {
namespace {

bool OverApprovalLimit(const saga::StepContext& ctx) {
  return ctx.Input<DeliverOrder>().order.at("amount_cents").get<long long>() >
         kDeliveryApprovalOverCents;
}

// An operator's decision on an order over the limit: {"by": who} and, when refused,
// {"reason": why}; each a string of 1-200 bytes.
void ValidateDecision(const std::string&, const nlohmann::json& payload) {
  saga::Fields f(payload);
  f.Text("by", 200);
  if (payload.contains("reason")) f.Text("reason", 200);
  f.Done();
}

saga::StepResult Decide(const std::string& event, const nlohmann::json& payload,
                        const saga::StepContext&) {
  if (event == "order_rejected") {
    return saga::StepResult::Terminal(422, "order_rejected",
                                      payload.value("reason", "the order was not approved"));
  }
  return saga::StepResult::Succeeded({{"approved_by", payload.at("by")}});
}

}  // namespace

DeliverOrder ParseDeliverOrder(const nlohmann::json& body) {
  saga::Fields f(body);
  DeliverOrder in{f.Raw("order"), f.Raw("address")};
  f.Done();
  // The child's and the shipment's own rules, here, so that a run the route accepts is
  // never refused later as malformed (which would leave it stuck, not failed).
  if (auto problem = ValidateOrder(in.order); !problem.empty()) {
    throw saga::InvalidInput("order: " + problem);
  }
  if (auto problem = ValidateAddress(in.address, "address."); !problem.empty()) {
    throw saga::InvalidInput(problem);
  }
  return in;
}

// [child-saga]
saga::Definition MakeDeliverOrderSaga(idemsaga::Participants& participants,
                                      const DeliverOrderOptions& options) {
  auto& shipping = participants.Get("shipping");
  using Ctx = saga::StepContext;
  auto placed = [](const Ctx& ctx, const char* step) -> const nlohmann::json& {
    return ctx.Output("order").at("outputs").at(step);
  };
  return saga::Definition("deliver_order", /*version=*/1)
      .Input<DeliverOrder>(ParseDeliverOrder)
      .Child("order",
             MakePlaceOrderSaga(participants.Get("inventory"), participants.Get("payment"),
                                options.place_order),
             [](const Ctx& ctx) { return ctx.Input<DeliverOrder>().order; })
      .Await("approval",
             {.events = {"order_approved", "order_rejected"},
              .timeout = options.approval_timeout,
              .validate = ValidateDecision,
              .decide = Decide,
              .on_timeout = saga::StepResult::Terminal(
                  422, "order_not_approved", "nobody approved the order in time; it was refunded")})
      .When(OverApprovalLimit)
      .Step(
          "shipping",
          [&shipping, placed](Ctx& ctx) {
            return shipping.Post("/v1/shipments", ctx,
                                 {{"reservation_id", placed(ctx, "inventory").at("reservation_id")},
                                  {"address", ctx.Input<DeliverOrder>().address}});
          },
          [&shipping](Ctx& ctx) { return shipping.Compensate("/v1/shipments/cancel", ctx); },
          {.call_timeout = std::chrono::seconds(2)})
      .Answer([placed](const Ctx& ctx) {
        return saga::SuccessAnswer{
            201,
            {{"status", "completed"},
             {"idempotency_key", ctx.parent_key},
             {"reservation_id", placed(ctx, "inventory").at("reservation_id")},
             {"charge_id", placed(ctx, "payment").at("charge_id")},
             {"shipment_id", ctx.Output("shipping").at("shipment_id")}}};
      });
}
// [child-saga]

}  // namespace idemsaga::steps
