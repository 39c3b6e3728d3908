// Runs a program without a shell and waits for it. Thread-safe (fork/exec per call).
#pragma once

#include <string>
#include <vector>

namespace idemsaga::common {

// Runs argv[0] (searched on PATH) with stdout and stderr appended to `log_path` ("" keeps
// them). Returns the exit status, or -1 if it could not start or died on a signal.
int RunProgram(const std::vector<std::string>& argv, const std::string& log_path = "");

// Like RunProgram, and returns what it printed on stdout (trailing newline removed).
// Throws std::runtime_error when it exits non-zero.
std::string ReadProgramOutput(const std::vector<std::string>& argv);

}  // namespace idemsaga::common
