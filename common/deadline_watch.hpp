// Calls a function at a deadline unless its owner let go of it first; one thread for all of
// them. Made for "answer within a budget, else say it goes on": almost every owner lets go
// long before its deadline, so a watch costs an append to a queue, no wake-up of the thread.
// The thread wakes at the earliest deadline but no more often than every `granularity`, so a
// deadline fires up to `granularity` late. Deadlines are expected in the order they are added
// (one budget for all): one added earlier than a pending one waits behind it.
//   common::DeadlineWatch watch(std::chrono::milliseconds(50));
//   auto handle = watch.Add(now + budget, [] { SendAccepted(); });
//   Work();
//   handle.reset();  // finished in time: the function never runs
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace idemsaga::common {

class DeadlineWatch {
 public:
  using Clock = std::chrono::steady_clock;

  explicit DeadlineWatch(std::chrono::milliseconds granularity);
  ~DeadlineWatch();
  DeadlineWatch(const DeadlineWatch&) = delete;
  DeadlineWatch& operator=(const DeadlineWatch&) = delete;

  // `fn` runs on the watch's thread at `at`, unless the handle (and every copy) is gone by
  // then; letting go of the handle does not wait for a run already under way. After Stop()
  // nothing runs and the handle is inert. `fn` must not destroy the watch.
  std::shared_ptr<void> Add(Clock::time_point at, std::function<void()> fn);
  // Joins the thread; pending functions never run. Idempotent.
  void Stop();

 private:
  struct Entry {
    std::function<void()> fn;
  };
  struct Pending {
    Clock::time_point at;
    std::weak_ptr<Entry> entry;
  };
  void Loop();

  const std::chrono::milliseconds granularity_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stopping_ = false;
  std::once_flag joined_;
  std::thread thread_;
};

}  // namespace idemsaga::common
