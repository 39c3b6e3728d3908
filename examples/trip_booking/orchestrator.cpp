// [trip-orchestrator]
// The trip orchestrator: every command and flag of `idemsaga orchestrator`, serving the
// trip saga at POST /v1/runs/trip.
//   trip_orchestrator orchestrator --database-url postgresql://... --migrate \
//       --participant hotel=http://127.0.0.1:9001 --participant car=http://127.0.0.1:9002
#include <idemsaga/app.hpp>

#include "trip_saga.hpp"

int main(int argc, char** argv) {
  idemsaga::App app({.name = "trip_orchestrator", .description = "books trips"});
  app.Participant("hotel")
      .Participant("car", {.business_errors = {"no_cars"}})
      .Saga(trip::MakeTripSaga);
  return app.Run(argc, argv);
}
// [trip-orchestrator]
