// A binary's serving lifetime, written once for every command that serves (`idemsaga
// orchestrator`, the demo participants, `idemsaga dev`, idemsaga::Participant::Run): start the
// services in order, each serving on a thread of its own (or already serving, with only a
// stop), say it is ready, wait for SIGINT or SIGTERM, then stop them in the reverse order and
// join their threads. A drain belongs in a service's `stop` (the orchestrator's is
// Shutdown(grace)): the stops run one after another, so a queue stopped before the orchestrator
// hands its unanswered messages back while the orchestrator still drains.
//
// The stop signals must be blocked in every thread (BlockStopSignals() in main, before any
// thread starts), so only Wait() sees them. Not thread-safe: one thread adds, waits and stops.
// The destructor stops what was started, so a failure between Add and Wait (a start-up check
// that throws) leaves no thread serving.
//   ServeUntilSignal serving("inventory");
//   serving.Add([&] { svc.Serve(); }, [&] { svc.Stop(); });
//   serving.Wait("inventory ready on http://127.0.0.1:8081");
//   serving.Stop();
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace idemsaga::app {

class ServeUntilSignal {
 public:
  // `name` is the service the logs name.
  explicit ServeUntilSignal(std::string name);
  ~ServeUntilSignal();
  ServeUntilSignal(const ServeUntilSignal&) = delete;
  ServeUntilSignal& operator=(const ServeUntilSignal&) = delete;

  // Runs `serve` on a thread of its own; Stop() calls `stop`, which must make `serve` return.
  // An empty `serve`: the service serves on threads of its own already, and only `stop` is kept.
  void Add(std::function<void()> serve, std::function<void()> stop);
  // Prints `ready` (one line on stdout: what scripts and tests wait for), then waits for
  // SIGINT or SIGTERM and logs it. With `still_running`, asks it every `poll` too and returns 0
  // once it says no (a dependency gone: stop rather than serve without it). Returns the signal.
  int Wait(const std::string& ready, std::function<bool()> still_running = {},
           std::chrono::milliseconds poll = std::chrono::seconds(1));
  // Stops every service in the reverse order of Add and joins its thread; once.
  void Stop();

 private:
  struct Service {
    std::function<void()> stop;
    std::thread thread;
  };
  std::string name_;
  std::vector<Service> services_;
};

}  // namespace idemsaga::app
