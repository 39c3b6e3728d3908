#include "common/group_commit.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using idemsaga::common::GroupCommit;

// A batch runner that records every batch and can hold the first one until told to go, so a
// test decides what queues behind it instead of guessing from the clock.
class Recorder {
 public:
  std::vector<int> Run(std::span<const int* const> batch) {
    std::unique_lock lock(mu_);
    batches_.emplace_back();
    for (const int* r : batch) batches_.back().push_back(*r);
    threads_.push_back(std::this_thread::get_id());
    if (hold_first_ && batches_.size() == 1) {
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    if (fail_batch_ == static_cast<int>(batches_.size())) throw std::runtime_error("disk full");
    std::vector<int> out;
    for (const int* r : batch) out.push_back(*r * 10);
    return out;
  }
  void WaitEntered() {
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(10), [&] { return entered_; }));
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<std::vector<int>> batches() {
    std::lock_guard lock(mu_);
    return batches_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard lock(mu_);
    return threads_;
  }

  bool hold_first_ = false;
  int fail_batch_ = 0;  // 1-based; 0: none fails

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false, released_ = false;
  std::vector<std::vector<int>> batches_;
  std::vector<std::thread::id> threads_;
};

GroupCommit<int, int>::Run RunOf(Recorder& r) {
  return [&r](std::span<const int* const> b) { return r.Run(b); };
}

// Waits until `n` callers are queued behind the held batch: Submit has no hook, so the test
// counts the callers that have started and gives them a moment; the assertions below do not
// depend on it (they accept any split of the queued callers into batches).
void LetThemQueue() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

TEST(GroupCommitTest, OneCallerAloneRunsABatchOfOneOnItsOwnThread) {
  Recorder r;
  GroupCommit<int, int> gc(64, 1, RunOf(r));
  EXPECT_EQ(gc.Submit(7), 70);
  EXPECT_EQ(gc.Submit(8), 80);
  EXPECT_EQ(r.batches(), (std::vector<std::vector<int>>{{7}, {8}}));
  EXPECT_EQ(r.threads(),
            (std::vector<std::thread::id>{std::this_thread::get_id(), std::this_thread::get_id()}));
}

TEST(GroupCommitTest, CallersThatArriveDuringABatchGoTogetherAndEachGetsItsOwnResult) {
  Recorder r;
  r.hold_first_ = true;
  GroupCommit<int, int> gc(64, 1, RunOf(r));
  std::vector<int> results(33, -1);
  std::vector<std::thread> threads;
  threads.emplace_back([&] { results[0] = gc.Submit(0); });
  r.WaitEntered();
  for (int i = 1; i <= 32; ++i) threads.emplace_back([&, i] { results[i] = gc.Submit(i); });
  LetThemQueue();
  r.Release();
  for (auto& t : threads) t.join();
  for (int i = 0; i <= 32; ++i) EXPECT_EQ(results[i], i * 10) << i;
  auto batches = r.batches();
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(batches[0], std::vector<int>{0});
  // Everything that queued while the first batch was out went in the second (the 200 ms gave
  // every thread time to queue; if one was late it rides a third batch, never a lost one).
  std::vector<int> seen;
  for (size_t b = 1; b < batches.size(); ++b) {
    seen.insert(seen.end(), batches[b].begin(), batches[b].end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> want;
  for (int i = 1; i <= 32; ++i) want.push_back(i);
  EXPECT_EQ(seen, want);
  EXPECT_GE(batches[1].size(), 16u) << "callers queued behind a batch were not grouped";
}

TEST(GroupCommitTest, NoBatchIsLargerThanMaxBatch) {
  Recorder r;
  r.hold_first_ = true;
  GroupCommit<int, int> gc(4, 1, RunOf(r));
  std::vector<std::thread> threads;
  std::atomic<int> sum{0};
  threads.emplace_back([&] { sum += gc.Submit(0); });
  r.WaitEntered();
  for (int i = 1; i <= 13; ++i) threads.emplace_back([&, i] { sum += gc.Submit(i); });
  LetThemQueue();
  r.Release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(sum.load(), 10 * (13 * 14 / 2));
  size_t total = 0;
  for (const auto& b : r.batches()) {
    EXPECT_LE(b.size(), 4u);
    total += b.size();
  }
  EXPECT_EQ(total, 14u);
  EXPECT_GE(r.batches().size(), 5u);  // 1 + ceil(13 / 4)
}

TEST(GroupCommitTest, AFailedBatchFailsItsCallersOnlyAndTheNextBatchRuns) {
  Recorder r;
  r.hold_first_ = true;
  r.fail_batch_ = 2;
  GroupCommit<int, int> gc(64, 1, RunOf(r));
  std::vector<std::thread> threads;
  std::atomic<int> failed{0}, ok{0};
  auto call = [&](int i) {
    try {
      EXPECT_EQ(gc.Submit(i), i * 10);
      ++ok;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "disk full");
      ++failed;
    }
  };
  threads.emplace_back(call, 0);
  r.WaitEntered();
  for (int i = 1; i <= 8; ++i) threads.emplace_back(call, i);
  LetThemQueue();
  r.Release();
  for (auto& t : threads) t.join();
  auto batches = r.batches();
  ASSERT_GE(batches.size(), 2u);
  EXPECT_EQ(failed.load(), static_cast<int>(batches[1].size()));
  EXPECT_EQ(ok.load() + failed.load(), 9);
  EXPECT_EQ(gc.Submit(5), 50);  // the group goes on after a failure
}

TEST(GroupCommitTest, ManyThreadsManyRoundsLoseNoCallerAndMixNoResults) {
  std::atomic<int> batches{0};
  GroupCommit<int, int> gc(8, 2, [&](std::span<const int* const> b) {
    ++batches;
    std::vector<int> out;
    for (const int* r : b) out.push_back(*r + 1);
    return out;
  });
  std::vector<std::thread> threads;
  std::atomic<long long> bad{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        int v = t * 100000 + i;
        if (gc.Submit(v) != v + 1) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(batches.load(), 16 * 2000);
}

TEST(GroupCommitTest, UpToMaxInflightBatchesGoAtOnceBeforeAnyCallerQueues) {
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0, most_inside = 0;
  bool go = false;
  GroupCommit<int, int> gc(64, 2, [&](std::span<const int* const> b) {
    std::unique_lock lock(mu);
    most_inside = std::max(most_inside, ++inside);
    cv.notify_all();
    cv.wait(lock, [&] { return go; });
    --inside;
    std::vector<int> out;
    for (const int* r : b) out.push_back(*r);
    return out;
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { EXPECT_EQ(gc.Submit(i), i); });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return inside == 2; }));
  }
  for (int i = 2; i < 10; ++i) threads.emplace_back([&, i] { EXPECT_EQ(gc.Submit(i), i); });
  LetThemQueue();
  {
    std::lock_guard lock(mu);
    go = true;
    cv.notify_all();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most_inside, 2);
  auto stats = gc.stats();
  EXPECT_EQ(stats.requests, 10);
  EXPECT_LE(stats.batches, 4);  // 2 at once, then the 8 queued behind them in one or two
  EXPECT_GE(stats.largest, 4u);
}

TEST(GroupCommitTest, ABatchAnsweringTheWrongNumberOfResultsIsAnError) {
  GroupCommit<int, int> gc(8, 1, [](std::span<const int* const>) { return std::vector<int>{}; });
  EXPECT_THROW(gc.Submit(1), std::logic_error);
  EXPECT_THROW((GroupCommit<int, int>(0, 1, nullptr)), std::invalid_argument);
}

}  // namespace
