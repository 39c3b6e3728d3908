#include "app/signals.hpp"

#include <signal.h>

#include <csignal>
#include <ctime>

namespace idemsaga::app {
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

int WaitForStopSignal(std::chrono::milliseconds poll, const std::function<bool()>& keep_waiting) {
  sigset_t set = StopSignals();
  const timespec every{static_cast<time_t>(poll.count() / 1000),
                       static_cast<long>((poll.count() % 1000) * 1000000)};
  for (;;) {
    int sig = sigtimedwait(&set, nullptr, &every);
    if (sig > 0) return sig;
    if (!keep_waiting()) return 0;
  }
}

}  // namespace idemsaga::app
