#include "steps/sagas.hpp"

#include "common/log.hpp"
#include "steps/deliver_order.hpp"
#include "steps/place_order.hpp"
#include "steps/ship_order.hpp"

namespace idemsaga::steps {
namespace {

// A saga that ships: served only when a shipping participant is configured.
SagaFactory NeedsShipping(const char* name,
                          std::function<saga::Definition(idemsaga::Participants&)> make,
                          const char* participant = "shipping",
                          const char* flag = "--participant shipping=URL") {
  return [name, make = std::move(make), participant,
          flag](idemsaga::Participants& p) -> std::optional<saga::Definition> {
    if (!p.Has(participant)) {
      common::Log("saga_not_served", {{"saga", name}, {"needs", flag}});
      return std::nullopt;
    }
    return make(p);
  };
}

// The inputs' schemas, as docs/openapi/orchestrator.json defines them.
nlohmann::json Ref(const char* schema) {
  return {{"$ref", std::string("#/components/schemas/") + schema}};
}
const nlohmann::json kDeliverOrderSchema = {
    {"type", "object"},
    {"required", {"order", "address"}},
    {"additionalProperties", false},
    {"properties", {{"order", Ref("Order")}, {"address", Ref("Address")}}}};

}  // namespace

std::vector<SagaFactory> ShippedSagas(const PlaceOrderOptions& place_order) {
  return {
      [](idemsaga::Participants& p) {
        return MakePlaceOrderSagaV1(p.Get("inventory"), p.Get("payment")).InputSchema(Ref("Order"));
      },
      [place_order](idemsaga::Participants& p) {
        return MakePlaceOrderSaga(p.Get("inventory"), p.Get("payment"), place_order)
            .InputSchema(Ref("Order"));
      },
      [place_order](idemsaga::Participants& p) {
        return MakePlaceOrderParallelSaga(p.Get("inventory"), p.Get("payment"), place_order)
            .InputSchema(Ref("Order"));
      },
      NeedsShipping("ship_order",
                    [](idemsaga::Participants& p) {
                      return MakeShipOrderSaga(p).InputSchema(Ref("ShipOrder"));
                    }),
      // Shipping through its queue: new runs take version 2 when it is configured.
      NeedsShipping(
          "ship_order",
          [](idemsaga::Participants& p) {
            return MakeShipOrderSaga(p, 2).InputSchema(Ref("ShipOrder"));
          },
          "shipping_queue", "--participant-queue shipping_queue=QUEUE"),
      NeedsShipping("deliver_order", [place_order](idemsaga::Participants& p) {
        return MakeDeliverOrderSaga(p, {.place_order = place_order})
            .InputSchema(kDeliverOrderSchema);
      })};
}

}  // namespace idemsaga::steps
