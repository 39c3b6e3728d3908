#include "steps/sagas.hpp"

#include "steps/place_order.hpp"
#include "steps/ship_order.hpp"

namespace steps {

std::vector<SagaFactory> ShippedSagas() {
  return {[](client::Participants& p) {
            return MakePlaceOrderSaga(p.Get("inventory"), p.Get("payment"));
          },
          MakeShipOrderSaga};
}

}  // namespace steps
