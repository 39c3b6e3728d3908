// SagaService's running side: drives one claimed saga to its end (or its stop) on the thread
// it is called on, with a journal that writes the parent row only under the saga's lease.
// See saga_service.hpp for the contract.
#include <stdexcept>

#include "common/log.hpp"
#include "common/pg/errors.hpp"
#include "orchestrator/response.hpp"
#include "orchestrator/run_outcomes.hpp"
#include "orchestrator/saga_service.hpp"

namespace idemsaga::orchestrator {
namespace {

using Clock = std::chrono::steady_clock;

// The runner's durable side: the parent row, written only under this saga's lease.
class StoreJournal : public steps::saga::Journal {
 public:
  // `cancel`: set by SagaService::Cancel while the saga runs in this process.
  StoreJournal(store::ParentStore& store, store::EventStore& events, const store::Claim& claim,
               std::shared_ptr<std::atomic<bool>> cancel)
      : store_(store),
        events_(events),
        lease_(claim.lease),
        renewed_at_(claim.leased_at),
        cancel_(std::move(cancel)) {
    if (!claim.row.cancel_requested.is_null()) *cancel_ = true;
  }

  // Renews once a third of the lease has passed: the happy path (well under that) adds no
  // commit, and a slow saga renews long before its lease could expire. A renewal also hears
  // of a cancel asked of another replica.
  bool KeepLease() override {
    if (Clock::now() - renewed_at_ < store_.options().lease / 3) return true;
    bool cancel = false;
    if (!store_.Renew(lease_, &cancel)) return false;
    if (cancel) *cancel_ = true;
    renewed_at_ = Clock::now();
    return true;
  }

  bool CancelRequested() override { return *cancel_; }

  // KeepLease renews once a third has passed: asked that often, it renews in time.
  std::chrono::milliseconds KeepLeaseEvery() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(store_.options().lease / 3);
  }

  ParkResult Park(const std::vector<steps::saga::StepRecord>& steps,
                  std::chrono::milliseconds wake_in) override {
    return store_.Park(lease_, steps::saga::ToJson(steps), wake_in) ? ParkResult::kParked
                                                                    : ParkResult::kFenced;
  }

  std::optional<steps::saga::ReceivedEvent> Event(const std::vector<std::string>& names) override {
    return events_.Take(lease_.tenant_id, lease_.key, names);
  }

  AwaitResult AwaitEvent(const std::vector<steps::saga::StepRecord>& steps,
                         const std::vector<std::string>& names,
                         std::chrono::milliseconds wake_in) override {
    switch (store_.ParkForEvents(lease_, steps::saga::ToJson(steps), names, wake_in)) {
      case store::ParentStore::AwaitOutcome::kParked:
        return AwaitResult::kParked;
      case store::ParentStore::AwaitOutcome::kFenced:
        return AwaitResult::kFenced;
      case store::ParentStore::AwaitOutcome::kArrived:
        renewed_at_ = Clock::now();
        return AwaitResult::kArrived;
    }
    return AwaitResult::kFenced;
  }

  bool BeginCompensation(const std::vector<steps::saga::StepRecord>& steps,
                         const steps::saga::StepResult& cause,
                         const std::string& failed_step) override {
    return store_.BeginCompensation(lease_, steps::saga::ToJson(steps), failed_step,
                                    steps::saga::FailureToJson(cause));
  }

  bool DeferStuck(const std::vector<steps::saga::StepRecord>& steps,
                  std::chrono::milliseconds retry_in) override {
    return store_.DeferStuck(lease_, steps::saga::ToJson(steps), retry_in);
  }

 private:
  store::ParentStore& store_;
  store::EventStore& events_;
  store::Lease lease_;
  Clock::time_point renewed_at_;
  std::shared_ptr<std::atomic<bool>> cancel_;
};

// What the runner needs from a stored row. Throws std::invalid_argument on a row with a step
// record or a failure this build cannot read.
steps::saga::SagaInput InputOf(const store::SagaRow& row, bool resumed) {
  if (auto why = row.UnreadableWhy()) throw std::invalid_argument(*why);
  steps::saga::SagaInput input;
  input.tenant_id = row.tenant_id;
  input.parent_key = row.key;
  input.request = row.request_body;
  input.trace_id = row.trace_id;
  input.root_span_id = row.root_span_id;
  input.resumed = resumed;
  std::vector<steps::saga::StepRecord> steps = row.steps;
  if (row.status == store::SagaStatus::kCompensating) {
    input.compensating = std::move(steps);
    input.failure = row.failure.value_or(steps::saga::FailureFromJson(nullptr));
    input.failed_step = row.failed_step;
  } else if (!steps.empty()) {
    input.checkpoint = std::move(steps);  // parked, or deferred while running
  }
  return input;
}

}  // namespace

RunOutcome SagaService::Drive(const store::Claim& claim, std::shared_ptr<const std::any> typed,
                              std::chrono::steady_clock::time_point answer_by) {
  // running_ was counted when the saga was posted, so queued sagas count as running too.
  CountDown done{running_};
  const store::SagaRow& row = claim.row;
  struct GiveBack {
    SagaService& s;
    const std::string& tenant;
    ~GiveBack() { s.GiveTenantSlot(tenant); }
  } give_back{*this, row.tenant_id};
  // Cancels asked of this process reach the runner at once; the journal's lease renewals
  // bring those asked of another replica.
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  const std::string running_key = row.tenant_id + '\n' + row.key;
  {
    std::lock_guard lock(cancels_mutex_);
    cancels_[running_key] = cancel;
  }
  struct Unregister {
    SagaService& s;
    const std::string& k;
    ~Unregister() {
      std::lock_guard lock(s.cancels_mutex_);
      s.cancels_.erase(k);
    }
  } unregister{*this, running_key};
  StoreJournal journal(store_, events_, claim, cancel);
  try {
    // The definition the saga started with, never a newer one: its steps and compensations
    // are what ran. A build without it must not guess.
    const steps::saga::Definition* definition = registry_.Find(row.saga_name, row.saga_version);
    if (definition == nullptr) {
      common::Log("saga_definition_missing", {{"tenant", row.tenant_id},
                                              {"key", row.key},
                                              {"saga", row.saga_name},
                                              {"version", std::to_string(row.saga_version)},
                                              {"trace_id", row.trace_id}});
      store_.DeferStuck(claim.lease, store::StepsColumn(row), policy_.stuck_retry_interval);
      return outcomes::Unavailable(
          "this saga's definition is not served by this build; retry later");
    }
    steps::saga::SagaInput input;
    try {
      input = InputOf(row, claim.kind == store::Claim::kTakenOver);
      input.answer_by = answer_by;
      // Resumed: the stored request, parsed as the definition it started with reads it.
      input.typed = typed ? std::move(typed) : definition->ParseInput(row.request_body);
    } catch (const std::exception& e) {  // json, InvalidInput, an unknown step status
      // A row this build cannot read: running anything could undo the wrong thing. Keep it
      // visible (stuck), with the steps it recorded, and let an operator look; recovery
      // retries it at the stuck pace.
      common::Log("saga_unreadable", {{"tenant", row.tenant_id},
                                      {"key", row.key},
                                      {"error", e.what()},
                                      {"trace_id", row.trace_id}});
      store_.DeferStuck(claim.lease, store::StepsColumn(row), policy_.stuck_retry_interval);
      return outcomes::Unavailable("the order cannot be resumed now; retry later");
    }
    steps::saga::Runner runner(
        *definition, policy_, [this](std::chrono::milliseconds d) { SleepUnlessStopping(d); },
        [this] { return stopping_.load(); }, tracer_, &runner_metrics_, {}, options_.at_boundary);
    auto started = std::chrono::steady_clock::now();
    steps::saga::SagaResult result = runner.Run(std::move(input), journal);
    durations_.With({definition->name(), steps::saga::ToString(result.end)})
        .Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (result.end == steps::saga::SagaEnd::kAbandoned) {
      return outcomes::Unavailable("the service is shutting down; retry with the same key");
    }
    if (result.end == steps::saga::SagaEnd::kParked ||
        result.end == steps::saga::SagaEnd::kDeferred) {
      // Set aside, for recovery to resume: parked (waiting with no thread held, until its
      // wake-up time) or stuck (a compensation keeps failing, or a step is blocked on a
      // configuration fault). The caller polls the saga, or retries the key (409 until then).
      RunOutcome running = outcomes::Running(row, KeyOutcome::kNone);
      running.status = result.failed_step.empty() ? store::SagaStatus::kStarted
                                                  : store::SagaStatus::kCompensating;
      (result.end == steps::saga::SagaEnd::kParked ? running.waiting : running.stuck) = true;
      if (!result.waiting_for.empty()) running.waiting_for = result.waiting_for;
      return running;
    }
    if (result.end == steps::saga::SagaEnd::kCompleted ||
        result.end == steps::saga::SagaEnd::kFailed) {
      auto response = BuildResponse(
          result, {row.order_id, row.key, row.trace_id, StatusPath(row.saga_name, row.key)});
      bool completed = result.end == steps::saga::SagaEnd::kCompleted;
      if (store_.Finish(claim.lease, completed, response.status, response.body,
                        steps::saga::ToJson(result.steps), common::http::StoredHeaders(response))) {
        if (options_.at_boundary) options_.at_boundary("after_finish");
        // Not remembered yet: most keys are never sent again, and copying every answer into
        // memory cost each order an allocation burst and the cache its whole budget. The
        // first replay reads the row (Replay remembers it); a storm after it comes from memory.
        common::Log("saga_finished", {{"tenant", row.tenant_id},
                                      {"key", row.key},
                                      {"status", ToString(completed ? store::SagaStatus::kCompleted
                                                                    : store::SagaStatus::kFailed)},
                                      {"http_status", std::to_string(response.status)},
                                      {"trace_id", row.trace_id}});
        RunOutcome finished;
        finished.kind = RunOutcome::Kind::kFinished;
        finished.answer = std::move(response);
        finished.order_id = row.order_id;
        return finished;
      }
    }
    // Fenced: another owner has the saga now; answer from what it has stored, if anything.
    auto now = store_.Get(row.tenant_id, row.key);
    if (now && !now->response_body.empty()) return Replay(*now);
    return outcomes::InProgress(now.value_or(row));
  } catch (...) {
    // The database (or a bug) stopped us mid-saga. A final answer may have been stored (a
    // COMMIT in doubt) or not: a retry replays it, or once the lease expires, a retry or the
    // sweeper resumes with the same derived keys. Only an outage
    // is a 503 that invites the retry; anything else says what it is.
    auto failure = common::pg::Classify(std::current_exception());
    bool outage = failure.kind == common::pg::Failure::kUnavailable;
    common::Log(outage ? "saga_interrupted" : "saga_interrupted_by_error",
                {{"tenant", row.tenant_id},
                 {"key", row.key},
                 {"sqlstate", failure.sqlstate},
                 {"error", failure.what},
                 {"trace_id", row.trace_id}});
    if (!outage) {
      return outcomes::Internal("the order stopped on an internal error; nothing final was stored");
    }
    return outcomes::Unavailable("the order could not be completed now; retry with the same key");
  }
}

}  // namespace idemsaga::orchestrator
