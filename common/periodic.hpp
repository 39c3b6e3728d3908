// Runs a function every `interval` on a thread of its own (a Boost.Asio steady_timer), until
// Stop() or destruction. A run that throws is logged and the schedule goes on: background
// work (recovery sweeps, garbage collection) must survive a database restart.
// Thread-safe: Start() and Stop() may race from different threads (a service starts its
// background work on the thread that serves and is stopped from another). Once stopped it
// stays stopped: a Start() that comes after Stop() does nothing, so a service stopped before
// it got to serve never leaves a timer thread running.
//   common::Periodic gc("gc", std::chrono::seconds(60), [&] { store.DeleteExpired(1000); });
//   gc.Start();
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace idemsaga::common {

class Periodic {
 public:
  Periodic(std::string name, std::chrono::milliseconds interval, std::function<void()> fn);
  ~Periodic();
  void Start();
  void Stop();

 private:
  void Arm();

  std::string name_;
  std::chrono::milliseconds interval_;
  std::function<void()> fn_;
  boost::asio::io_context io_;
  boost::asio::steady_timer timer_;
  std::mutex mutex_;  // guards thread_ and stopped_
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace idemsaga::common
