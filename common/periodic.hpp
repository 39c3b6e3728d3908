// Runs a function every `interval` on a thread of its own (a Boost.Asio steady_timer), until
// Stop() or destruction. A run that throws is logged and the schedule goes on: background
// work (recovery sweeps, garbage collection) must survive a database restart.
// Thread-safe: Start() and Stop() may race from different threads (a service starts its
// background work on the thread that serves and is stopped from another). Once stopped it
// stays stopped: a Start() that comes after Stop() does nothing, so a service stopped before
// it got to serve never leaves a timer thread running.
//   common::Periodic gc("gc", std::chrono::seconds(60), [&] { store.DeleteExpired(1000); });
//   gc.Start();
// A run that works through a backlog in batches paces itself with Drain (below), so a burst of
// expired keys costs the requests beside it a share of the machine, not all of it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
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

  // For the function: runs `batch` (which does up to `size` items and returns how many it
  // did) until it does fewer, resting after each full batch `rest` times as long as that batch
  // took (at most a second), so however large the backlog the drain is busy at most
  // 1 / (1 + rest) of the time, and the work beside it keeps its share; stops early when
  // Stop() comes.
  // Returns the items done.
  long long Drain(const std::function<long long()>& batch, long long size, double rest = 3.0);

 private:
  // Waits `d` unless Stop() comes first; false when stopping.
  bool Rest(std::chrono::steady_clock::duration d);

  void Arm();

  std::string name_;
  std::chrono::milliseconds interval_;
  std::function<void()> fn_;
  boost::asio::io_context io_;
  boost::asio::steady_timer timer_;
  std::mutex mutex_;  // guards thread_ and stopped_
  std::condition_variable stopping_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace idemsaga::common
