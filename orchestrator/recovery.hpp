// Recovery and garbage collection, one of each in every orchestrator replica.
//
// The sweeper takes over running sagas whose lease expired (their owner crashed, stalled, or
// deferred a stuck compensation) with FOR UPDATE SKIP LOCKED, so two replicas never resume
// the same saga, and drives them to an end through the same runner: a `started` saga is
// re-driven from its first step with the same derived keys (participants replay what they
// did), a `compensating` one finishes compensating. It claims no more than the saga pool can
// start at once. Garbage collection deletes finished keys past retention, in batches, then
// their traces' spans, and spans no key accounts for.
// Start/Stop from one thread.
#pragma once

#include <atomic>
#include <chrono>

#include "common/periodic.hpp"
#include "orchestrator/saga_service.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/span_store.hpp"

namespace idemsaga::orchestrator {

struct RecoveryOptions {
  bool enabled = true;
  std::chrono::milliseconds sweep_interval{1000};  // how soon an expired lease is noticed
  int sweep_batch = 32;                            // sagas taken over per sweep, at most
  std::chrono::milliseconds gc_interval{60000};
  int gc_batch = 1000;  // rows per DELETE: short transactions, however large the backlog
};

class Recovery {
 public:
  Recovery(store::ParentStore& store, store::SpanStore& spans, SagaService& sagas,
           RecoveryOptions options);
  void Start();
  void Stop();

  // One sweep now (tests, and `POST /v1/sagas/{key}/retry`); returns the sagas taken over
  // and resumed here (none once shutting down).
  int SweepOnce();

 private:
  // What the sweeper runs each interval: sweeps again at once while sweeps come back full,
  // for up to one interval, so that many sagas due together (timers that fire at once, a
  // storm of events) resume at the pace of the saga pool rather than one batch a tick.
  void Drain();
  // Takes over and resumes up to `capacity` sagas; returns how many it resumed.
  int Sweep(int capacity);

  void CollectGarbage();

  store::ParentStore& store_;
  store::SpanStore& spans_;
  SagaService& sagas_;
  RecoveryOptions options_;
  std::atomic<bool> stopping_{false};
  common::Periodic sweeper_;
  common::Periodic collector_;
};

}  // namespace idemsaga::orchestrator
