// Doubles of the saga engine's seams for tests without a network or a database: scripted
// participants (answers by derived key, every call logged) and an in-memory journal that
// records what the runner made durable, parks when asked to, and holds delivered events.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "steps/saga/runner.hpp"

namespace test_support {

// A participant double: answers each derived key from a script and logs every call. Safe to
// call from parallel branches.
class FakeParticipants {
 public:
  // Answers for `key`, in order; the last one repeats.
  void Script(const std::string& key, std::vector<idemsaga::steps::saga::StepResult> answers) {
    std::lock_guard lock(mu_);
    scripts_[key] = std::deque<idemsaga::steps::saga::StepResult>(answers.begin(), answers.end());
  }
  // The first call of `key` answers only once `other` has answered, and 50 ms later (or after
  // 5 s, which `timed_out` reports): orders parallel branches, and proves they overlap.
  void After(const std::string& key, const std::string& other) {
    std::lock_guard lock(mu_);
    after_[key] = other;
  }
  // Each of `keys` answers only once all of them have been called (or after 5 s, which
  // `timed_out` reports): proves that their calls overlap.
  void Together(const std::vector<std::string>& keys) {
    std::lock_guard lock(mu_);
    for (const auto& k : keys) together_[k] = keys;
  }
  idemsaga::steps::saga::StepFn Step() {
    return [this](idemsaga::steps::saga::StepContext& ctx) {
      std::unique_lock lock(mu_);
      calls.push_back(ctx.derived_key);
      called_.insert(ctx.derived_key);
      cv_.notify_all();
      if (auto t = together_.find(ctx.derived_key); t != together_.end()) {
        auto all_called = [&, keys = t->second] {
          return std::all_of(keys.begin(), keys.end(),
                             [&](const std::string& k) { return called_.count(k) > 0; });
        };
        if (!cv_.wait_for(lock, std::chrono::seconds(5), all_called)) timed_out = true;
      }
      if (auto a = after_.find(ctx.derived_key); a != after_.end()) {
        std::string other = a->second;
        after_.erase(a);
        if (!cv_.wait_for(lock, std::chrono::seconds(5),
                          [&] { return answered_.count(other) > 0; })) {
          timed_out = true;
        }
        // Time for the other branch to report its end to the runner before this one does.
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        lock.lock();
      }
      answered_.insert(ctx.derived_key);
      cv_.notify_all();
      auto it = scripts_.find(ctx.derived_key);
      if (it == scripts_.end()) {
        return idemsaga::steps::saga::StepResult::Succeeded(
            {{ctx.step_name + "_id", ctx.step_name + "-1"}});
      }
      idemsaga::steps::saga::StepResult r = it->second.front();
      if (it->second.size() > 1) it->second.pop_front();
      return r;
    };
  }
  std::vector<std::string> calls;
  bool timed_out = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<idemsaga::steps::saga::StepResult>> scripts_;
  std::map<std::string, std::string> after_;
  std::map<std::string, std::vector<std::string>> together_;
  std::set<std::string> answered_, called_;
};

// A run of `d` as the tests' saga: parent key "A" of tenant demo, a fixed trace id.
inline idemsaga::steps::saga::SagaResult RunAsA(
    const idemsaga::steps::saga::Definition& d, const idemsaga::steps::saga::RetryPolicy& policy,
    idemsaga::steps::saga::Journal& journal, idemsaga::steps::saga::SagaInput input = {},
    idemsaga::steps::saga::Runner::Sleep sleep = [](std::chrono::milliseconds) {}) {
  input.parent_key = "A";
  input.tenant_id = "demo";
  input.trace_id = std::string(32, 'a');
  return idemsaga::steps::saga::Runner(d, policy, std::move(sleep)).Run(std::move(input), journal);
}

// The record of step `name`; throws std::out_of_range when there is none.
inline const idemsaga::steps::saga::StepRecord& StepNamed(
    const std::vector<idemsaga::steps::saga::StepRecord>& steps, const std::string& name) {
  for (const auto& s : steps) {
    if (s.name == name) return s;
  }
  throw std::out_of_range(name);
}

class FakeJournal : public idemsaga::steps::saga::Journal {
 public:
  bool KeepLease() override {
    ++lease_checks;
    return lease_checks <= lose_lease_after;
  }
  bool BeginCompensation(const std::vector<idemsaga::steps::saga::StepRecord>& steps,
                         const idemsaga::steps::saga::StepResult&,
                         const std::string& failed_step) override {
    events.push_back("begin_compensation:" + failed_step);
    compensating_steps = steps;
    return allow_begin;
  }
  bool DeferStuck(const std::vector<idemsaga::steps::saga::StepRecord>& steps,
                  std::chrono::milliseconds retry_in) override {
    events.push_back("stuck");
    deferred_for = retry_in;
    compensating_steps = steps;
    return true;
  }
  ParkResult Park(const std::vector<idemsaga::steps::saga::StepRecord>& steps,
                  std::chrono::milliseconds wake_in) override {
    if (!can_park) return ParkResult::kUnsupported;
    events.push_back("park");
    parked_for = wake_in;
    checkpoint = steps;
    return ParkResult::kParked;
  }
  std::chrono::milliseconds KeepLeaseEvery() const override { return keep_lease_every; }
  bool CancelRequested() override {
    return cancel_after_boundaries >= 0 && boundaries++ >= cancel_after_boundaries;
  }
  bool can_park = false;  // a journal of our own that parks (the store's does)
  std::chrono::milliseconds parked_for{0};
  std::vector<idemsaga::steps::saga::StepRecord> checkpoint;
  int cancel_after_boundaries = -1;  // the cancel arrives once this many steps have begun
  int boundaries = 0;
  std::chrono::milliseconds keep_lease_every{2000};
  std::chrono::milliseconds deferred_for{0};
  int lease_checks = 0;
  int lose_lease_after = 1 << 30;
  bool allow_begin = true;
  // External events: Deliver() stores one (the first of a name wins, as the store's does).
  void Deliver(const std::string& name, nlohmann::json payload) {
    for (const auto& e : delivered) {
      if (e.name == name) return;
    }
    delivered.push_back({name, std::move(payload)});
  }
  std::optional<idemsaga::steps::saga::ReceivedEvent> Event(
      const std::vector<std::string>& names) override {
    ++event_reads;
    for (const auto& e : delivered) {
      for (const auto& n : names) {
        if (e.name == n) return e;
      }
    }
    return std::nullopt;
  }
  AwaitResult AwaitEvent(const std::vector<idemsaga::steps::saga::StepRecord>& steps,
                         const std::vector<std::string>& names,
                         std::chrono::milliseconds wake_in) override {
    if (!can_park) return AwaitResult::kUnsupported;
    events.push_back("await");
    parked_for = wake_in;
    checkpoint = steps;
    if (deliver_while_parking) {
      Deliver(deliver_while_parking->name, deliver_while_parking->payload);
      deliver_while_parking.reset();
      return AwaitResult::kArrived;
    }
    awaited = names;
    return AwaitResult::kParked;
  }
  std::vector<idemsaga::steps::saga::ReceivedEvent> delivered;
  // Delivered during the next AwaitEvent (the race a store closes by re-reading after parking).
  std::optional<idemsaga::steps::saga::ReceivedEvent> deliver_while_parking;
  std::vector<std::string> awaited;
  int event_reads = 0;
  std::vector<std::string> events;
  std::vector<idemsaga::steps::saga::StepRecord> compensating_steps;
};

}  // namespace test_support
