// The trip saga: book a hotel, then rent a car; if the car cannot be had, the hotel booking is
// cancelled. Idempotency keys, retries, compensation bookkeeping and recovery come from
// idemsaga.
#pragma once

#include <idemsaga/saga.hpp>
#include <string>

namespace trip {

struct Trip {
  std::string city;
};

saga::Definition MakeTripSaga(steps::client::Participants& participants);

}  // namespace trip
