// Group commit at the application level: the writes that concurrent callers make at the same
// moment go to the database as one statement, one round trip and one commit, and each caller
// is answered only once that commit is done (durable when the statement is: nothing is
// acknowledged earlier than it would be alone).
//
// No timer and no thread of its own: a caller that finds fewer than `max_inflight` batches out
// runs a batch of one at once on its own thread (so one caller alone waits for nothing); the
// callers that arrive while all are out queue up, and when a batch returns, the first of them
// runs the next, of all that queued meanwhile (up to `max_batch`), on its own thread, and only
// the callers a batch answered are woken. Batches therefore grow with the load: what
// PostgreSQL's own group flush does for WAL, one level up, where it also saves the statements,
// the round trips and the context switches.
//
// `run` gets the batch's requests in arrival order and returns one result per request in the
// same order; when it throws, every caller of that batch gets the exception.
//   common::GroupCommit<Claim, Result> claims(64, 2, [&](std::span<const Claim* const> b) {
//     return ClaimAll(b);
//   });
//   Result r = claims.Submit(claim);  // from any thread
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <semaphore>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

namespace idemsaga::common {

template <typename Req, typename Res>
class GroupCommit {
 public:
  using Run = std::function<std::vector<Res>(std::span<const Req* const> batch)>;

  // `max_inflight`: how many batches may be out at once. A caller that finds fewer out runs
  // its own at once; only when all are out do callers queue and go together.
  GroupCommit(size_t max_batch, size_t max_inflight, Run run)
      : max_batch_(max_batch), max_inflight_(max_inflight), run_(std::move(run)) {
    if (max_batch_ == 0 || max_inflight_ == 0) {
      throw std::invalid_argument("GroupCommit: max_batch and max_inflight must be at least 1");
    }
  }
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  struct Stats {
    long long batches = 0;
    long long requests = 0;
    size_t largest = 0;  // requests in the largest batch
  };
  Stats stats() {
    std::lock_guard lock(mu_);
    return stats_;
  }

  Res Submit(const Req& req) {
    Waiter me{&req};
    {
      std::unique_lock lock(mu_);
      if (leaders_ < max_inflight_) {
        ++leaders_;  // the queue is empty whenever a batch could go: lead at once
        me.lead = true;
      } else {
        queue_.push_back(&me);
        lock.unlock();
        me.wake.acquire();  // answered, or handed the lead
      }
    }
    if (me.lead) Lead(me);
    if (me.error) std::rethrow_exception(me.error);
    return std::move(*me.result);
  }

 private:
  struct Waiter {
    const Req* req;
    std::optional<Res> result;
    std::exception_ptr error;
    bool lead = false;
    std::binary_semaphore wake{0};
  };

  // Runs one batch: `me` and the callers queued first.
  void Lead(Waiter& me) {
    std::vector<Waiter*> batch{&me};
    {
      std::lock_guard lock(mu_);
      while (!queue_.empty() && batch.size() < max_batch_) {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
      ++stats_.batches;
      stats_.requests += static_cast<long long>(batch.size());
      stats_.largest = std::max(stats_.largest, batch.size());
    }
    std::vector<const Req*> reqs;
    reqs.reserve(batch.size());
    for (auto* w : batch) reqs.push_back(w->req);
    try {
      auto results = run_(reqs);
      if (results.size() != batch.size()) {
        throw std::logic_error("GroupCommit: a batch answered the wrong number of results");
      }
      for (size_t i = 0; i < batch.size(); ++i) batch[i]->result.emplace(std::move(results[i]));
    } catch (...) {
      for (auto* w : batch) w->error = std::current_exception();
    }
    Waiter* next = nullptr;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty()) {
        --leaders_;
      } else {
        next = queue_.front();  // leads the next batch in this one's place
        queue_.pop_front();
        next->lead = true;
      }
    }
    // A waiter's frame may be gone once it is woken: nothing of it is touched after.
    if (next != nullptr) next->wake.release();
    for (auto* w : batch) {
      if (w != &me) w->wake.release();
    }
  }

  const size_t max_batch_;
  const size_t max_inflight_;
  Run run_;
  std::mutex mu_;
  std::deque<Waiter*> queue_;
  size_t leaders_ = 0;  // batches out, or about to be (a successor being woken)
  Stats stats_;
};

}  // namespace idemsaga::common
