// The trip saga: book a hotel, then rent a car; when no car can be had, the hotel booking is
// cancelled. Keys, retries, compensation and recovery come from idemsaga.
#pragma once

#include <idemsaga/saga.hpp>

namespace trip {

struct Trip {
  std::string city;
};

idemsaga::Definition MakeTripSaga(idemsaga::Participants& participants);

}  // namespace trip
