#include "steps/sagas.hpp"

#include "common/log.hpp"
#include "steps/place_order.hpp"
#include "steps/ship_order.hpp"

namespace steps {

std::vector<SagaFactory> ShippedSagas(const PlaceOrderOptions& place_order) {
  return {[](client::Participants& p) {
            return MakePlaceOrderSagaV1(p.Get("inventory"), p.Get("payment"));
          },
          [place_order](client::Participants& p) {
            return MakePlaceOrderSaga(p.Get("inventory"), p.Get("payment"), place_order);
          },
          [place_order](client::Participants& p) {
            return MakePlaceOrderParallelSaga(p.Get("inventory"), p.Get("payment"), place_order);
          },
          [](client::Participants& p) -> std::optional<saga::Definition> {
            if (!p.Has("shipping")) {
              common::Log("saga_not_served",
                          {{"saga", "ship_order"}, {"needs", "--participant shipping=URL"}});
              return std::nullopt;
            }
            return MakeShipOrderSaga(p);
          }};
}

}  // namespace steps
