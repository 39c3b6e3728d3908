#include "app/serve_until_signal.hpp"

#include <iostream>

#include "app/signals.hpp"
#include "common/log.hpp"

namespace idemsaga::app {

ServeUntilSignal::ServeUntilSignal(std::string name) : name_(std::move(name)) {}

ServeUntilSignal::~ServeUntilSignal() {
  try {
    Stop();
  } catch (const std::exception& e) {  // already unwinding from the error that matters
    common::Log("stop_failed", {{"service", name_}, {"error", e.what()}});
  } catch (...) {
    common::Log("stop_failed", {{"service", name_}});
  }
}

void ServeUntilSignal::Add(std::function<void()> serve, std::function<void()> stop) {
  Service service{.stop = std::move(stop)};
  if (serve) service.thread = std::thread(std::move(serve));
  services_.push_back(std::move(service));
}

int ServeUntilSignal::Wait(const std::string& ready, std::function<bool()> still_running,
                           std::chrono::milliseconds poll) {
  std::cout << ready << std::endl;
  int sig = still_running ? WaitForStopSignal(poll, still_running) : WaitForStopSignal();
  common::Log("shutdown", {{"service", name_}, {"signal", sig ? std::to_string(sig) : "none"}});
  return sig;
}

void ServeUntilSignal::Stop() {
  // Every service stops and every thread is joined even when a stop throws: a joinable
  // std::thread left behind would end the process. The first error is rethrown afterwards.
  std::exception_ptr first_error;
  while (!services_.empty()) {
    Service service = std::move(services_.back());
    services_.pop_back();
    try {
      if (service.stop) service.stop();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
    if (service.thread.joinable()) service.thread.join();
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace idemsaga::app
