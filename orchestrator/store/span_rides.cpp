#include "orchestrator/store/span_rides.hpp"

namespace idemsaga::orchestrator::store {

struct SpanRides::Part {
  std::string member;
  // kWaiting in the queue; kTaken by a finish in flight; kLanded stored by it; kAlone for its
  // owner to write (too large, not taken in time, or its finish failed).
  enum State { kWaiting, kTaken, kLanded, kAlone } state = kWaiting;
};

namespace {

// A JSON object of `members`, each `"key":value`.
template <typename Range, typename Member>
std::string Object(const Range& members, Member member) {
  std::string doc = "{";
  for (const auto& m : members) {
    if (doc.size() > 1) doc.push_back(',');
    doc.append(member(m));
  }
  doc.push_back('}');
  return doc;
}

}  // namespace

std::string SpanRides::Doc(const std::vector<std::string>& members) {
  return Object(members, [](const std::string& m) -> const std::string& { return m; });
}

void SpanRides::Carry(std::vector<std::string> members,
                      const std::function<void(const std::string&)>& write_alone) {
  if (members.empty()) return;
  std::vector<std::shared_ptr<Part>> mine;
  {
    std::unique_lock lock(mutex_);
    auto now = std::chrono::steady_clock::now();
    if (now - last_finish_ >= options_.idle) {
      alone_ += static_cast<long long>(members.size());
      lock.unlock();
      return write_alone(Doc(members));
    }
    for (auto& m : members) {
      mine.push_back(std::make_shared<Part>(Part{std::move(m)}));
      // A row larger than a finish's load goes alone (its trace's spans of one batch, say a
      // storm of replays joining one trace): libpq never shrinks a connection's buffers, and
      // the order pool's connections are to stay small.
      if (mine.back()->member.size() > options_.max_bytes) {
        mine.back()->state = Part::kAlone;
      } else {
        waiting_.push_back(mine.back());
      }
    }
    auto deadline = now + options_.wait;
    for (;;) {
      bool waiting = false, taken = false;
      for (const auto& p : mine) {
        waiting |= p->state == Part::kWaiting;
        taken |= p->state == Part::kTaken;
      }
      if (!waiting && !taken) break;
      if (waiting && std::chrono::steady_clock::now() >= deadline) {
        // Left in the queue, skipped by Take.
        for (auto& p : mine) {
          if (p->state == Part::kWaiting) p->state = Part::kAlone;
        }
        continue;
      }
      if (waiting) {
        landed_.wait_until(lock, deadline);
      } else {
        landed_.wait(lock);  // a finish in flight: its statement has a timeout
      }
    }
    members.clear();
    for (auto& p : mine) {
      if (p->state == Part::kAlone) members.push_back(std::move(p->member));
    }
    alone_ += static_cast<long long>(members.size());
  }
  if (!members.empty()) write_alone(Doc(members));
}

SpanRides::Load SpanRides::Take() {
  Load load;
  {
    std::lock_guard lock(mutex_);
    last_finish_ = std::chrono::steady_clock::now();
    size_t bytes = 0;
    while (!waiting_.empty()) {
      auto& p = waiting_.front();
      if (p->state != Part::kWaiting) {
        waiting_.pop_front();
        continue;
      }
      if (!load.parts.empty() && bytes + p->member.size() > options_.max_bytes) break;
      p->state = Part::kTaken;
      bytes += p->member.size();
      load.parts.push_back(std::move(p));
      waiting_.pop_front();
    }
  }
  if (load.parts.empty()) return load;
  // Read, not moved, outside the lock: no one touches a taken part's row until Done, and its
  // owner writes it if this finish fails.
  load.doc = Object(load.parts, [](const auto& p) -> const std::string& { return p->member; });
  return load;
}

void SpanRides::Done(Load& load, bool committed) {
  if (load.parts.empty()) return;
  {
    std::lock_guard lock(mutex_);
    for (auto& p : load.parts) p->state = committed ? Part::kLanded : Part::kAlone;
    if (committed) carried_ += static_cast<long long>(load.parts.size());
  }
  load.parts.clear();
  load.doc = "{}";
  landed_.notify_all();
}

long long SpanRides::carried() const {
  std::lock_guard lock(mutex_);
  return carried_;
}

long long SpanRides::alone() const {
  std::lock_guard lock(mutex_);
  return alone_;
}

}  // namespace idemsaga::orchestrator::store
