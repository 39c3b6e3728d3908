#include "common/periodic.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

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

// Drain: batches until one comes back short, resting between full ones in proportion to
// how long each took, so a backlog never takes the database's whole time.
TEST(Periodic, DrainRestsBetweenFullBatchesAndEndsAtAShortOne) {
  std::vector<std::chrono::steady_clock::time_point> starts, ends;
  Runs done;
  long long total = 0;
  Periodic* self = nullptr;
  Periodic p("drain", milliseconds(1), [&] {
    if (!starts.empty()) return;
    total = self->Drain(
        [&] {
          starts.push_back(std::chrono::steady_clock::now());
          std::this_thread::sleep_for(milliseconds(20));
          ends.push_back(std::chrono::steady_clock::now());
          return starts.size() < 3 ? 100LL : 7LL;
        },
        100, 3.0);
    done.Add();
  });
  self = &p;
  p.Start();
  ASSERT_TRUE(done.WaitFor(1));
  p.Stop();
  EXPECT_EQ(total, 207);
  ASSERT_EQ(starts.size(), 3u);
  for (size_t i = 1; i < starts.size(); ++i) {
    // Rested about three times the 20 ms the batch took; a lower bound only.
    EXPECT_GE(starts[i] - ends[i - 1], milliseconds(50)) << "batch " << i;
  }
}

// An endless backlog does not hold up Stop(): it ends the drain while it rests.
TEST(Periodic, StopEndsADrainThatWouldNeverFinish) {
  Runs batches;
  Periodic* self = nullptr;
  Periodic p("endless", milliseconds(1), [&] {
    self->Drain(
        [&] {
          batches.Add();
          std::this_thread::sleep_for(milliseconds(50));
          return 10LL;
        },
        10, 100.0);
  });
  self = &p;
  p.Start();
  ASSERT_TRUE(batches.WaitFor(1));
  p.Stop();  // would never return if the drain went on
  int after_stop = batches.Count();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(batches.Count(), after_stop);
}
