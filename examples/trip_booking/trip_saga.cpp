#include "trip_saga.hpp"

namespace trip {

// [trip-saga]
Trip ParseTrip(const nlohmann::json& body) {
  saga::Fields f(body);
  Trip trip{f.Text("city", 64)};
  f.Done();
  return trip;
}

saga::Definition MakeTripSaga(steps::client::Participants& participants) {
  auto& hotel = participants.Get("hotel");
  auto& car = participants.Get("car");
  using Ctx = saga::StepContext;
  return saga::Definition("trip", /*version=*/1)
      .Input<Trip>(ParseTrip)
      .Step(
          "hotel",
          [&](Ctx& ctx) {
            return hotel.Post("/v1/bookings", ctx, {{"city", ctx.Input<Trip>().city}});
          },
          [&](Ctx& ctx) { return hotel.Compensate("/v1/bookings/cancel", ctx); })
      .Step(
          "car",
          [&](Ctx& ctx) {
            return car.Post("/v1/rentals", ctx, {{"city", ctx.Input<Trip>().city}});
          },
          [&](Ctx& ctx) { return car.Compensate("/v1/rentals/cancel", ctx); });
}
// [trip-saga]

}  // namespace trip
