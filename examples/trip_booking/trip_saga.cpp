#include "trip_saga.hpp"

namespace trip {

// [trip-saga]
Trip ParseTrip(const nlohmann::json& body) {
  idemsaga::Fields f(body);
  Trip trip{f.Text("city", 64)};
  f.Done();
  return trip;
}

idemsaga::Definition MakeTripSaga(idemsaga::Participants& participants) {
  auto& hotel = participants.Get("hotel");
  auto& car = participants.Get("car");
  using Ctx = idemsaga::StepContext;
  auto city = [](Ctx& c) { return nlohmann::json{{"city", c.Input<Trip>().city}}; };
  return idemsaga::Definition("trip", /*version=*/1)
      .Input<Trip>(ParseTrip)
      .Step(
          "hotel", [&hotel, city](Ctx& c) { return hotel.Post("/v1/bookings", c, city(c)); },
          [&hotel](Ctx& c) { return hotel.Compensate("/v1/bookings/cancel", c); })
      .Step(
          "car", [&car, city](Ctx& c) { return car.Post("/v1/rentals", c, city(c)); },
          [&car](Ctx& c) { return car.Compensate("/v1/rentals/cancel", c); });
}
// [trip-saga]

}  // namespace trip
