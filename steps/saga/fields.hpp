// The definition of a saga: see include/idemsaga/saga.hpp (steps/saga/step.hpp names it here).
#pragma once

#include "steps/saga/step.hpp"
