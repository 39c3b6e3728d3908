#include "common/periodic.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace {

using common::Periodic;
using std::chrono::milliseconds;

// Counts runs; a test waits on the count instead of on the clock.
class Runs {
 public:
  void Add() {
    std::lock_guard lock(mutex_);
    ++n_;
    changed_.notify_all();
  }
  bool WaitFor(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return n_ >= n; });
  }
  int Count() {
    std::lock_guard lock(mutex_);
    return n_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int n_ = 0;
};

TEST(Periodic, RunsAgainAndAgainUntilStopped) {
  Runs runs;
  Periodic p("count", milliseconds(1), [&] { runs.Add(); });
  p.Start();
  EXPECT_TRUE(runs.WaitFor(3));
  p.Stop();
}

TEST(Periodic, ARunThatThrowsDoesNotEndTheSchedule) {
  Runs runs;
  Periodic p("throws", milliseconds(1), [&] {
    runs.Add();
    throw std::runtime_error("database down");
  });
  p.Start();
  EXPECT_TRUE(runs.WaitFor(3));
}

// A service starts its background work on the serving thread and is stopped from another
// (ParticipantService::Serve and Stop): the race ThreadSanitizer reported on thread_.
TEST(Periodic, StartAndStopMayRaceFromTwoThreads) {
  for (int i = 0; i < 50; ++i) {
    Runs runs;
    Periodic p("race", milliseconds(1), [&] { runs.Add(); });
    std::thread serving([&] { p.Start(); });
    p.Stop();
    serving.join();
  }
}

TEST(Periodic, AStartAfterStopRunsNothing) {
  Runs runs;
  Periodic p("late", milliseconds(1), [&] { runs.Add(); });
  p.Stop();
  p.Start();
  // An absence can only be observed over time: twenty intervals.
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(runs.Count(), 0);
}

}  // namespace
