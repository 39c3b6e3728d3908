#include "common/deadline_watch.hpp"

#include <algorithm>
#include <vector>

#include "common/log.hpp"

namespace idemsaga::common {

DeadlineWatch::DeadlineWatch(std::chrono::milliseconds granularity)
    : granularity_(granularity), thread_([this] { Loop(); }) {}

DeadlineWatch::~DeadlineWatch() { Stop(); }

std::shared_ptr<void> DeadlineWatch::Add(Clock::time_point at, std::function<void()> fn) {
  // Its own allocation, not make_shared: the queue's weak_ptr must not keep the function
  // (and what it captured) alive until the deadline passes.
  std::shared_ptr<Entry> entry(new Entry{std::move(fn)});
  bool was_empty = false;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return entry;
    was_empty = pending_.empty();
    pending_.push_back({at, entry});
  }
  // The thread sleeps without a deadline only when nothing is pending.
  if (was_empty) cv_.notify_one();
  return entry;
}

void DeadlineWatch::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  std::call_once(joined_, [this] {
    if (thread_.get_id() != std::this_thread::get_id()) {
      thread_.join();
    } else {
      thread_.detach();  // Stop() from a function it runs
    }
  });
}

void DeadlineWatch::Loop() {
  std::unique_lock lock(mutex_);
  std::vector<std::shared_ptr<Entry>> due;
  while (!stopping_) {
    auto now = Clock::now();
    // Drops what was let go of and takes what is due, from the front: both are what most of
    // the queue is, in order.
    while (!pending_.empty() && (pending_.front().at <= now || pending_.front().entry.expired())) {
      if (pending_.front().at <= now) {
        if (auto e = pending_.front().entry.lock()) due.push_back(std::move(e));
      }
      pending_.pop_front();
    }
    if (!due.empty()) {
      lock.unlock();
      for (auto& e : due) {
        try {
          e->fn();
        } catch (const std::exception& ex) {  // bad_alloc: the watch must go on
          Log("deadline_watch_failed", {{"error", ex.what()}});
        }
      }
      due.clear();  // outside the lock: an entry's captures may be heavy to free
      lock.lock();
      continue;
    }
    if (pending_.empty()) {
      cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    } else {
      cv_.wait_until(lock, std::max(pending_.front().at, now + granularity_));
    }
  }
}

}  // namespace idemsaga::common
