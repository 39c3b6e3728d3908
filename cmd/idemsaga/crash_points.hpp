// Named crash points for the fault suite: the stock binary's boundary hook
// (steps::saga::Runner::AtBoundary, SagaServiceOptions::at_boundary), armed by
// IDEMSAGA_CRASH_POINTS:
//   IDEMSAGA_CRASH_POINTS=after_claim            (the first time the point is reached)
//   IDEMSAGA_CRASH_POINTS=between_compensations@3,after_finish@2   (the Nth time)
// At an armed point the process SIGKILLs itself: no destructor, flush or commit runs, as in a
// real crash. Only the stock binary and the tests link this: the libraries a team's binary
// links report boundaries to whoever asks and carry no way to be killed from the environment
// (tests/unit/architecture_test.cpp). The hook is thread-safe.
#pragma once

#include <string_view>

#include "steps/saga/runner.hpp"

namespace idemsaga::cmd {

// The hook that kills at the points `spec` names (the form above); unset when it names none.
steps::saga::Runner::AtBoundary CrashPoints(std::string_view spec);

// CrashPoints of IDEMSAGA_CRASH_POINTS; unset when the variable is unset or empty.
steps::saga::Runner::AtBoundary CrashPointsFromEnvironment();

}  // namespace idemsaga::cmd
