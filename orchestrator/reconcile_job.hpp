// The orchestrator's periodic reconciliation: every `interval` it checks the sagas of the last
// `since` against every configured participant's keys (Reconciler), logs what disagrees, and
// says so in the metrics (idemsaga_reconcile_discrepancies, idemsaga_reconcile_runs_total by
// result), so an operator's alert needs no log search.
//
// Start() and Stop() may race from different threads (common::Periodic); Run() may be called
// beside the schedule (the reconciler only reads). An interval of 0 never runs on its own.
//   orchestrator::ReconcileJob job(store, participants, {.interval = 15min}, metrics);
//   job.Start(); ...; job.Stop();
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <string>

#include "common/metrics.hpp"
#include "common/periodic.hpp"
#include "orchestrator/reconcile.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator {

struct ReconcileJobOptions {
  std::chrono::milliseconds interval{std::chrono::minutes(15)};  // 0: never
  std::chrono::seconds since{std::chrono::hours(1)};
};

class ReconcileJob {
 public:
  ReconcileJob(store::ParentStore& store, std::map<std::string, ReconcileParticipant> participants,
               ReconcileJobOptions options, common::metrics::Registry& metrics);

  // One reconciliation of `since`, counted in the metrics (what each scheduled run does).
  ReconcileReport Run(std::chrono::seconds since);
  void Start();
  // Ends a run under way at its next page: a large window must not hold up a shutdown.
  void Stop() {
    stopping_ = true;
    periodic_.Stop();
  }

 private:
  store::ParentStore& store_;
  std::map<std::string, ReconcileParticipant> participants_;
  ReconcileJobOptions options_;
  common::metrics::Gauge& discrepancies_;
  common::metrics::Family<common::metrics::Counter>& runs_;
  std::atomic<bool> stopping_{false};
  common::Periodic periodic_;  // last: stopped before what it uses goes
};

}  // namespace idemsaga::orchestrator
