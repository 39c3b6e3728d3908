#include "common/periodic.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "common/deadline_watch.hpp"

namespace {

using idemsaga::common::Periodic;
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

using idemsaga::common::DeadlineWatch;

TEST(DeadlineWatch, RunsAtTheDeadlineWhatIsStillHeld) {
  DeadlineWatch watch(milliseconds(5));
  Runs runs;
  auto start = DeadlineWatch::Clock::now();
  auto held = watch.Add(start + milliseconds(50), [&] { runs.Add(); });
  ASSERT_TRUE(runs.WaitFor(1));
  EXPECT_GE(DeadlineWatch::Clock::now() - start, milliseconds(50));
}

TEST(DeadlineWatch, WhatWasLetGoOfNeverRuns) {
  DeadlineWatch watch(milliseconds(1));
  std::atomic<int> released_ran{0};
  Runs held_runs;
  auto now = DeadlineWatch::Clock::now();
  for (int i = 0; i < 100; ++i) {
    watch.Add(now + milliseconds(20), [&] { ++released_ran; });  // the handle dies here
  }
  auto held = watch.Add(now + milliseconds(40), [&] { held_runs.Add(); });
  ASSERT_TRUE(held_runs.WaitFor(1));  // behind the others: they were due first
  EXPECT_EQ(released_ran, 0);
}

TEST(DeadlineWatch, NothingRunsAfterStop) {
  std::atomic<int> ran{0};
  auto watch = std::make_unique<DeadlineWatch>(milliseconds(1));
  auto held = watch->Add(DeadlineWatch::Clock::now() + milliseconds(30), [&] { ++ran; });
  watch->Stop();
  auto late = watch->Add(DeadlineWatch::Clock::now(), [&] { ++ran; });
  std::this_thread::sleep_for(milliseconds(60));
  watch.reset();
  EXPECT_EQ(ran, 0);
}

// The watch is for answers within a budget: one due while the thread sleeps for a later one
// wakes it, however long the granularity.
TEST(DeadlineWatch, AFirstDeadlineWakesTheSleepingThread) {
  DeadlineWatch watch(milliseconds(1));
  Runs runs;
  auto first = watch.Add(DeadlineWatch::Clock::now() + milliseconds(10), [&] { runs.Add(); });
  ASSERT_TRUE(runs.WaitFor(1));
  auto second = watch.Add(DeadlineWatch::Clock::now() + milliseconds(10), [&] { runs.Add(); });
  EXPECT_TRUE(runs.WaitFor(2));
}

}  // namespace
