// Waits for SIGINT or SIGTERM on a dedicated thread. Call BlockStopSignals() in main before
// starting any thread, so every thread inherits the mask and only WaitForStopSignal() sees them.
#pragma once

#include <chrono>
#include <functional>

namespace idemsaga::app {

void BlockStopSignals();
// Returns the signal number received.
int WaitForStopSignal();
// The same, but asks `keep_waiting` every `poll` and returns 0 once it says no.
int WaitForStopSignal(std::chrono::milliseconds poll, const std::function<bool()>& keep_waiting);

}  // namespace idemsaga::app
