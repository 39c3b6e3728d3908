#include "steps/place_order.hpp"

#include "steps/order_schema.hpp"

namespace idemsaga::steps {
namespace {

saga::Definition OrderSaga(std::string name, int version) {
  return std::move(saga::Definition(std::move(name), version)
                       .Input<nlohmann::json>([](const nlohmann::json& body) {
                         if (auto problem = ValidateOrder(body); !problem.empty()) {
                           throw saga::InvalidInput(problem);
                         }
                         return body;
                       }));
}

// The two steps every version of place_order starts with.
saga::Definition ReserveAndCharge(int version, idemsaga::ParticipantClient& inventory,
                                  idemsaga::ParticipantClient& payment) {
  return std::move(OrderSaga("place_order", version)
                       .Step("inventory", ReserveItems(inventory), ReleaseItems(inventory))
                       .Step("payment", ChargeOrder(payment, version >= 2), RefundOrder(payment)));
}

bool NeedsConfirmation(const saga::StepContext& ctx) {
  return ctx.Output("payment").value("status", "") == "requires_action";
}

// The card holder's answer, posted by the client (or a payment provider's webhook) to
// /v1/runs/place_order/{key}/events/{payment_confirmed|payment_failed}.
saga::StepResult Confirmation(const std::string& event, const nlohmann::json& payload,
                              const saga::StepContext&) {
  if (event == "payment_failed") {
    std::string reason = payload.is_object() ? payload.value("reason", "") : "";
    return saga::StepResult::Terminal(
        402, "payment_failed",
        reason.empty() ? "the card holder did not confirm the payment" : reason);
  }
  return saga::StepResult::Succeeded(nlohmann::json::object());
}

void ValidateConfirmation(const std::string&, const nlohmann::json& payload) {
  if (!payload.is_object()) throw saga::InvalidInput("the payload must be a JSON object");
  for (const auto& [field, value] : payload.items()) {
    if (field != "reason") throw saga::InvalidInput("unknown field " + field);
    if (!value.is_string() || value.get_ref<const std::string&>().size() > 200) {
      throw saga::InvalidInput("reason must be a string of at most 200 bytes");
    }
  }
}

}  // namespace

saga::StepFn ReserveItems(idemsaga::ParticipantClient& inventory) {
  return [&inventory](saga::StepContext& ctx) {
    return inventory.Post("/v1/reservations", ctx, {{"items", (*ctx.request)["items"]}});
  };
}

saga::StepFn ReleaseItems(idemsaga::ParticipantClient& inventory) {
  return [&inventory](saga::StepContext& ctx) {
    return inventory.Compensate("/v1/reservations/release", ctx);
  };
}

saga::StepFn ChargeOrder(idemsaga::ParticipantClient& payment, bool three_d_secure) {
  return [&payment, three_d_secure](saga::StepContext& ctx) {
    const auto& r = *ctx.request;
    nlohmann::json charge = {{"amount_cents", r["amount_cents"]},
                             {"currency", r["currency"]},
                             {"customer_id", r["customer_id"]},
                             {"payment_method", r["payment_method"]}};
    if (three_d_secure) charge["three_d_secure"] = true;
    return payment.Post("/v1/charges", ctx, charge);
  };
}

saga::StepFn RefundOrder(idemsaga::ParticipantClient& payment) {
  return [&payment](saga::StepContext& ctx) { return payment.Compensate("/v1/refunds", ctx); };
}

saga::Definition MakePlaceOrderSagaV1(idemsaga::ParticipantClient& inventory,
                                      idemsaga::ParticipantClient& payment) {
  return ReserveAndCharge(1, inventory, payment);
}

namespace {

// After the charge: the card holder's 3-D Secure confirmation when the charge asked for one,
// then the capture.
saga::Definition& ConfirmAndCapture(saga::Definition& d, idemsaga::ParticipantClient& payment,
                                    const PlaceOrderOptions& options) {
  return d
      .Await("confirmation",
             {.events = {"payment_confirmed", "payment_failed"},
              .timeout = options.confirmation_timeout,
              .validate = ValidateConfirmation,
              .decide = Confirmation,
              .on_timeout = saga::StepResult::Terminal(
                  402, "payment_not_confirmed",
                  "the payment was not confirmed in time; the stock was released and the "
                  "authorisation voided")})
      .When(NeedsConfirmation)
      .Step(
          "capture",
          [&payment](saga::StepContext& ctx) {
            return payment.Post("/v1/captures", ctx,
                                {{"charge_id", ctx.Output("payment").at("charge_id")}});
          },
          [&payment](saga::StepContext& ctx) {
            return payment.Compensate("/v1/captures/refund", ctx);
          })
      .When(NeedsConfirmation);
}

}  // namespace

saga::Definition MakePlaceOrderSaga(idemsaga::ParticipantClient& inventory,
                                    idemsaga::ParticipantClient& payment,
                                    const PlaceOrderOptions& options) {
  saga::Definition d = ReserveAndCharge(2, inventory, payment);
  return std::move(ConfirmAndCapture(d, payment, options));
}

saga::Definition MakePlaceOrderParallelSaga(idemsaga::ParticipantClient& inventory,
                                            idemsaga::ParticipantClient& payment,
                                            const PlaceOrderOptions& options) {
  // [parallel-steps]
  saga::Definition d = OrderSaga("place_order_parallel", /*version=*/1);
  d.Parallel({{"inventory", ReserveItems(inventory), ReleaseItems(inventory)},
              {"payment", ChargeOrder(payment, /*three_d_secure=*/true), RefundOrder(payment)}});
  return std::move(ConfirmAndCapture(d, payment, options));  // as place_order version 2
  // [parallel-steps]
}

}  // namespace idemsaga::steps
