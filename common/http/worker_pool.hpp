// The server's workers: a fixed set of threads for blocking handlers behind a bounded queue.
// Internal to common/http (server.hpp is the public face). Thread-safe.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace idemsaga::common::http::detail {

// A fixed set of threads for blocking handlers behind a bounded queue. TryPush refuses
// instead of waiting: the event loop must never block, and an unbounded queue would turn
// overload into memory and latency instead of a quick 503.
class WorkerPool {
 public:
  WorkerPool(size_t threads, size_t queue)
      : threads_(std::max<size_t>(1, threads)), queue_(queue) {}
  ~WorkerPool() { Finish(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Start(const void* owner) {
    for (size_t i = 0; i < threads_; ++i) {
      workers_.emplace_back([this, owner] {
        current_owner_ = owner;
        Work();
      });
    }
  }

  // Accepts while the jobs running and waiting fit the workers plus the queue. (Counting
  // jobs, not idle workers: a worker that has not woken up yet is still a free one.)
  bool TryPush(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (shutdown_ || running_ + jobs_.size() >= threads_ + queue_) return false;
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
    return true;
  }

  // Runs what is queued, then joins.
  void Finish() {
    {
      std::lock_guard lock(mutex_);
      shutdown_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  static bool OnWorkerOf(const void* owner) { return current_owner_ == owner; }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shut down and drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
        ++running_;
      }
      job();
      job = nullptr;  // what it holds goes now, not after the next wait
      std::lock_guard lock(mutex_);
      --running_;
    }
  }

  static inline thread_local const void* current_owner_ = nullptr;
  const size_t threads_;
  const size_t queue_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  size_t running_ = 0;
  bool shutdown_ = false;
};

}  // namespace idemsaga::common::http::detail
