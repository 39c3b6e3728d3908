// Waits for SIGINT or SIGTERM on a dedicated thread. Call BlockStopSignals() in main before
// starting any thread, so every thread inherits the mask and only WaitForStopSignal() sees them.
#pragma once

namespace idemsaga_cmd {

void BlockStopSignals();
// Returns the signal number received.
int WaitForStopSignal();

}  // namespace idemsaga_cmd
