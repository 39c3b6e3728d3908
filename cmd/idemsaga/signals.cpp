#include "cmd/idemsaga/signals.hpp"

#include <csignal>

namespace idemsaga_cmd {
namespace {

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void BlockStopSignals() {
  sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer that goes away mid-write must not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
}

int WaitForStopSignal() {
  sigset_t set = StopSignals();
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

}  // namespace idemsaga_cmd
