// Starts a server process for a test (Redis, dynalite): a child that dies with the test process
// whatever ends it (PR_SET_PDEATHSIG), so a crashed or killed test leaves nothing running.
//   pid_t pid = test_support::SpawnTiedChild({"redis-server", "--port", "6390"}, log);
#pragma once

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_support {

// Runs args[0] (searched on PATH) with `args`, its stdout and stderr written to `log_path`
// ("": kept). Returns its PID; throws std::runtime_error when fork fails.
inline pid_t SpawnTiedChild(std::vector<std::string> args, const std::string& log_path = "") {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the parent died before prctl
    if (!log_path.empty()) {
      FILE* log = std::fopen(log_path.c_str(), "w");
      if (log != nullptr) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
      }
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Kills a child SpawnTiedChild started (SIGKILL), reaps it, and sets `pid` to -1; nothing
// when `pid` is not positive.
inline void KillTiedChild(pid_t& pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
}

}  // namespace test_support
