// Define sagas: steps with their compensations, typed inputs, per-step policies, and the
// participant clients that call guarded services with derived keys.
//   #include <idemsaga/saga.hpp>
//   saga::Definition("trip", 1).Input<Trip>(ParseTrip).Step("hotel", book, cancel) ...
#pragma once

#include "steps/client/participants.hpp"
#include "steps/saga/definition.hpp"
#include "steps/saga/fields.hpp"
#include "steps/saga/registry.hpp"
#include "steps/saga/runner.hpp"
#include "steps/saga/step.hpp"
#include "steps/sagas.hpp"
