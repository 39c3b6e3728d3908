#include "orchestrator/reconcile_job.hpp"

#include "common/log.hpp"

namespace idemsaga::orchestrator {

ReconcileJob::ReconcileJob(store::ParentStore& store,
                           std::map<std::string, ReconcileParticipant> participants,
                           ReconcileJobOptions options, common::metrics::Registry& metrics)
    : store_(store),
      participants_(std::move(participants)),
      options_(options),
      discrepancies_(
          metrics
              .Gauge("idemsaga_reconcile_discrepancies",
                     "Sagas and participant keys that disagreed at the last reconciliation.")
              .With({})),
      runs_(metrics.Counter("idemsaga_reconcile_runs_total",
                            "Reconciliations by result: clean, discrepancies, or "
                            "error (a participant could not be read).",
                            {"result"})),
      // A Periodic needs an interval even when it is never started.
      periodic_("reconcile",
                options_.interval.count() > 0 ? options_.interval : std::chrono::hours(24), [this] {
                  auto report = Run(options_.since);
                  if (stopping_) return;  // cut short by a shutdown: says nothing
                  if (!report.clean()) {
                    common::Log("reconcile_discrepancies",
                                {{"discrepancies", std::to_string(report.discrepancies_found)},
                                 {"errors", std::to_string(report.errors.size())},
                                 {"report", report.ToJson().dump()}});
                  }
                }) {}

ReconcileReport ReconcileJob::Run(std::chrono::seconds since) {
  auto report = Reconciler(store_, participants_,
                           {.since = since, .stopping = [this] { return stopping_.load(); }})
                    .Run();
  // A run a shutdown cut short is no result: the gauge and the counter keep the last one.
  if (stopping_) return report;
  discrepancies_.Set(static_cast<double>(report.discrepancies_found));
  runs_
      .With({!report.errors.empty()            ? "error"
             : report.discrepancies_found == 0 ? "clean"
                                               : "discrepancies"})
      .Inc();
  return report;
}

void ReconcileJob::Start() {
  if (options_.interval.count() > 0) periodic_.Start();
}

}  // namespace idemsaga::orchestrator
