// SagaService's front: construction and metrics, the claim of a key and what the request is
// told (Submit), where a claimed saga runs (the request's thread, the pool, or queued for
// recovery), cancel and resolve. Running a saga is saga_drive.cpp; the outcomes it gives are
// built by run_outcomes.cpp. See saga_service.hpp for the contract.
#include "orchestrator/saga_service.hpp"

#include <boost/asio/post.hpp>
#include <future>
#include <stdexcept>

#include "common/log.hpp"
#include "common/percent_encode.hpp"
#include "orchestrator/run_outcomes.hpp"

namespace idemsaga::orchestrator {

const char* ToString(KeyOutcome outcome) {
  switch (outcome) {
    case KeyOutcome::kNone:
      return "";
    case KeyOutcome::kClaimed:
      return "claimed";
    case KeyOutcome::kTakenOver:
      return "taken_over";
    case KeyOutcome::kReplayed:
      return "replayed";
    case KeyOutcome::kInProgress:
      return "in_progress";
    case KeyOutcome::kMismatch:
      return "reused";
  }
  return "";
}

std::string StatusPath(const std::string& saga_name, const std::string& key) {
  return (saga_name == kOrderSaga ? "/v1/orders/" : "/v1/runs/" + saga_name + "/") +
         common::PercentEncode(key);
}

SagaService::SagaService(store::ParentStore& store, store::EventStore& events,
                         const steps::saga::Registry& registry, steps::saga::RetryPolicy policy,
                         SagaServiceOptions options, const common::trace::Tracer* tracer,
                         common::metrics::Registry* metrics)
    : store_(store),
      events_(events),
      options_(std::move(options)),
      policy_(policy),
      registry_(registry),
      tracer_(tracer),
      finished_(options_.finished_cache),
      metrics_(metrics != nullptr ? *metrics : own_metrics_),
      runner_metrics_(metrics_),
      key_outcomes_(metrics_.Counter("idemsaga_idempotency_requests_total",
                                     "Requests by what their Idempotency-Key said: claimed, "
                                     "taken_over, replayed, in_progress (409), reused (422).",
                                     {"outcome"})),
      durations_(metrics_.Histogram("idemsaga_saga_duration_seconds",
                                    "How long one run of a saga took in this process, by saga "
                                    "and how it ended or stopped.",
                                    {"saga", "end"})),
      pool_(std::make_unique<boost::asio::thread_pool>(options_.threads)) {
  // Every outcome shows from the start, at 0: a rate over a series that appears late misses
  // its first increase.
  for (auto o : {KeyOutcome::kClaimed, KeyOutcome::kTakenOver, KeyOutcome::kReplayed,
                 KeyOutcome::kInProgress, KeyOutcome::kMismatch}) {
    key_outcomes_.With({ToString(o)});
  }
}

RunOutcome SagaService::Counted(RunOutcome o) {
  if (o.outcome != KeyOutcome::kNone) key_outcomes_.With({ToString(o.outcome)}).Inc();
  return o;
}

SagaService::~SagaService() { Shutdown(); }

void SagaService::SleepUnlessStopping(std::chrono::milliseconds d) {
  std::unique_lock lock(stop_mutex_);
  stop_cv_.wait_for(lock, d, [this] { return stopping_.load(); });
}

void SagaService::Shutdown() {
  {
    std::lock_guard lock(stop_mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  budget_watch_.Stop();
  if (pool_) {
    pool_->join();
    pool_.reset();
  }
}

store::FinishedAnswer SagaService::Remember(const store::SagaRow& row, int status,
                                            const std::string& body,
                                            std::map<std::string, std::string> headers,
                                            std::chrono::milliseconds row_expires_in) {
  store::FinishedAnswer answer{row.request_hash, status,           body,
                               row.trace_id,     row.root_span_id, std::move(headers)};
  finished_.Put(row.tenant_id, row.key, answer, row_expires_in);
  return answer;
}

RunOutcome SagaService::Replay(const store::SagaRow& row) {
  std::map<std::string, std::string> headers;
  if (row.response_headers.is_object()) {
    for (const auto& [name, value] : row.response_headers.items()) {
      if (value.is_string()) headers[name] = value.get<std::string>();
    }
  }
  return outcomes::Replay(
      Remember(row, row.response_status, row.response_body, std::move(headers),
               std::chrono::milliseconds(static_cast<long long>(row.expires_in_seconds * 1000))));
}

bool SagaService::TakeTenantSlot(const std::string& tenant) {
  if (options_.tenant_running_limit == 0) return true;  // no limit: nothing on the hot path
  std::lock_guard lock(cancels_mutex_);
  auto& n = tenant_running_[tenant];
  if (n >= options_.tenant_running_limit) return false;
  ++n;
  return true;
}

void SagaService::GiveTenantSlot(const std::string& tenant) {
  if (options_.tenant_running_limit == 0) return;
  std::lock_guard lock(cancels_mutex_);
  auto it = tenant_running_.find(tenant);
  if (it != tenant_running_.end() && --it->second == 0) tenant_running_.erase(it);
}

bool SagaService::Queue(const store::Claim& claim, std::chrono::milliseconds wake_in,
                        const char* reason) {
  if (!store_.Park(claim.lease, store::StepsColumn(claim.row), wake_in)) return false;
  common::Log("saga_queued", {{"tenant", claim.row.tenant_id},
                              {"key", claim.row.key},
                              {"reason", reason},
                              {"trace_id", claim.row.trace_id}});
  return true;
}

SagaService::CancelResult SagaService::Cancel(const store::SagaRow& row,
                                              const std::string& operator_name,
                                              const std::string& reason) {
  if (row.status == store::SagaStatus::kCompleted || row.status == store::SagaStatus::kFailed) {
    return CancelResult::kEnded;
  }
  if (row.status == store::SagaStatus::kCompensating) return CancelResult::kAlreadyCompensating;
  nlohmann::json request = {{"operator", operator_name}, {"reason", reason}};
  if (!store_.RequestCancel(row.tenant_id, row.key, request)) {
    // It moved on meanwhile: ended, or compensating after all.
    auto now = store_.Get(row.tenant_id, row.key);
    return now && now->status == store::SagaStatus::kCompensating
               ? CancelResult::kAlreadyCompensating
               : CancelResult::kEnded;
  }
  {
    std::lock_guard lock(cancels_mutex_);
    if (auto it = cancels_.find(row.tenant_id + '\n' + row.key); it != cancels_.end()) {
      *it->second = true;
    }
  }
  return CancelResult::kRequested;
}

std::optional<std::string> SagaService::Resolve(const store::SagaRow& row,
                                                const std::string& operator_name,
                                                const std::string& note) {
  if (row.status != store::SagaStatus::kCompensating || !row.stuck) return std::nullopt;
  // The stuck compensation is the first still to be undone in the order they run (the
  // reverse of the order the steps ended); the ones after it are the saga's to run.
  if (auto why = row.UnreadableWhy()) throw std::invalid_argument(*why);
  std::vector<steps::saga::StepRecord> records = row.steps;
  const steps::saga::Definition* definition = registry_.Find(row.saga_name, row.saga_version);
  for (size_t i : steps::saga::UndoOrder(records, definition)) {
    auto& step = records[i];
    if (step.status != steps::saga::StepStatus::kCompensating) continue;
    // A child saga's stuck compensation is one of its own steps: marking the whole child
    // undone would leave its other compensations unsent. Not resolvable by hand here.
    if (definition != nullptr && i < definition->steps().size() &&
        definition->steps()[i].kind == steps::saga::StepKind::kChild) {
      return std::nullopt;
    }
    step.status = steps::saga::StepStatus::kCompensated;
    step.detail = "compensated by hand (";
    step.detail.append(operator_name).append("): ").append(note);
    nlohmann::json resolution = {{"operator", operator_name}, {"note", note}, {"step", step.name}};
    if (!store_.Resolve(row.tenant_id, row.key, resolution, steps::saga::ToJson(records))) {
      return std::nullopt;
    }
    return step.name;
  }
  return std::nullopt;
}

bool SagaService::ResumeAsync(const store::Claim& claim) {
  if (stopping_) return false;
  if (!TakeTenantSlot(claim.row.tenant_id)) {
    // Its tenant has its fill running here: it waits, durably, for a later sweep (at a
    // second's pace, not the sweep's, which would take it again at once).
    Queue(claim, std::chrono::seconds(1), "tenant_limit");
    return true;
  }
  ++resumed_;
  ++running_;
  boost::asio::post(*pool_, [this, claim] {
    try {
      Drive(claim, nullptr);
    } catch (const std::exception& e) {
      common::Log("saga_interrupted", {{"key", claim.row.key}, {"error", e.what()}});
    }
  });
  return true;
}

int SagaService::FreeCapacity() const {
  return std::max(0, static_cast<int>(options_.threads) -
                         static_cast<int>(running_.load() - running_inline_.load()));
}

std::optional<store::FinishedAnswer> SagaService::CachedAnswer(const std::string& tenant_id,
                                                               const std::string& key,
                                                               const std::string& request_hash,
                                                               store::ReplaySample& sample) {
  if (stopping_) return std::nullopt;
  return finished_.Replay(tenant_id, key, request_hash, sample);
}

RunOutcome SagaService::Submit(const Submission& s) {
  if (stopping_) return outcomes::Unavailable("the service is shutting down");
  const store::ClaimRequest& req = s.request;
  if (s.replay) return Counted(outcomes::Replay(*s.replay));
  if (auto done = finished_.Get(req.tenant_id, req.key)) {
    if (req.Matches(done->request_hash)) return Counted(outcomes::Replay(*done));
    RunOutcome reused = outcomes::Reused();
    reused.trace_id = done->trace_id;
    reused.root_span_id = done->root_span_id;
    return Counted(std::move(reused));
  }
  store::ClaimRequest claiming = req;
  claiming.saga_name = s.definition->name();
  claiming.saga_version = s.definition->version();
  claiming.owner = options_.owner;
  store::Claim claim = store_.ClaimKey(claiming);
  RunOutcome outcome = AnswerClaim(claim, s);
  outcome.trace_id = claim.row.trace_id;
  outcome.root_span_id = claim.row.root_span_id;
  return Counted(std::move(outcome));
}

RunOutcome SagaService::AnswerClaim(const store::Claim& claim, const Submission& s) {
  if (claim.kind == store::Claim::kClaimed && options_.at_boundary)
    options_.at_boundary("after_claim");
  switch (claim.kind) {
    case store::Claim::kMismatch:
      return outcomes::Reused();
    case store::Claim::kFinished:
      return Replay(claim.row);
    case store::Claim::kInProgress:
      return outcomes::InProgress(claim.row);
    case store::Claim::kClaimed:
    case store::Claim::kTakenOver:
      break;
  }
  common::Log(claim.kind == store::Claim::kClaimed ? "saga_started" : "saga_resumed",
              {{"tenant", s.request.tenant_id},
               {"key", s.request.key},
               {"order_id", claim.row.order_id},
               {"trace_id", claim.row.trace_id}});
  ++running_;
  // A takeover resumes the definition the key started with: the route's typed input is for
  // the latest one, so the runner parses the stored request itself.
  auto input = claim.kind == store::Claim::kClaimed ? s.input : nullptr;
  auto outcome =
      claim.kind == store::Claim::kClaimed ? KeyOutcome::kClaimed : KeyOutcome::kTakenOver;
  // What a request still waiting after the response budget gets: the saga goes on.
  auto accepted = [running = outcomes::Running(claim.row, outcome)] { return running; };
  // Queued before anything runs when its tenant has its fill running here: answered running,
  // started by recovery once a slot is free.
  if (!TakeTenantSlot(s.request.tenant_id)) {
    --running_;
    if (!Queue(claim, std::chrono::milliseconds(0), "tenant_limit")) {
      return outcomes::InProgress(claim.row);
    }
    return accepted();
  }
  if (s.answer_early && ++running_inline_ <= static_cast<long long>(options_.inline_limit)) {
    CountDown done{running_inline_};
    // On the request's own thread: handing the saga to the pool and waiting for it cost four
    // context switches per order (19 of the dev process's, 15 without).
    auto answer_by = std::chrono::steady_clock::now() + options_.response_budget;
    auto late =
        budget_watch_.Add(answer_by, [send = s.answer_early, accepted] { send(accepted()); });
    RunOutcome o = Drive(claim, input, answer_by);
    o.outcome = outcome;
    return o;
  }
  if (s.answer_early) --running_inline_;  // over the limit: the pool's
  if (running_.load() - running_inline_.load() > static_cast<long long>(options_.threads)) {
    // Every thread is taken: the saga waits durably instead of holding this request's worker
    // (a worker held for the response budget is how one slow participant used to turn every
    // route into 503s). Its lease runs out now; recovery starts it when a thread is free.
    --running_;
    GiveTenantSlot(s.request.tenant_id);
    if (!Queue(claim, std::chrono::milliseconds(0), "threads")) {
      return outcomes::InProgress(claim.row);  // fenced: another owner has it already
    }
    return accepted();
  }
  if (s.answer_early) {
    // The request's worker does not wait for the pool: the saga's thread sends its answer, or
    // the budget watch a "still running", whichever comes first. A worker waiting on a saga held up
    // by a slow participant is how that participant used to turn every route into 503s.
    auto late = budget_watch_.Add(std::chrono::steady_clock::now() + options_.response_budget,
                                  [send = s.answer_early, accepted] { send(accepted()); });
    boost::asio::post(*pool_, [this, claim, input, outcome, send = s.answer_early, late] {
      RunOutcome o;
      try {
        o = Drive(claim, input);
      } catch (...) {  // Drive catches what it can; anything else must still answer
        o = outcomes::Unanswered(std::current_exception());
      }
      o.outcome = outcome;
      send(o);
    });
    RunOutcome later = accepted();
    later.deferred = true;
    return later;
  }
  auto promise = std::make_shared<std::promise<RunOutcome>>();
  auto future = promise->get_future();
  boost::asio::post(*pool_, [this, claim, promise, input] {
    // Drive catches what it can; anything else (bad_alloc) must still answer the request.
    try {
      promise->set_value(Drive(claim, input));
    } catch (...) {
      promise->set_exception(std::current_exception());
    }
  });
  if (future.wait_for(options_.response_budget) == std::future_status::ready) {
    RunOutcome o = future.get();
    o.outcome = outcome;
    return o;
  }
  return accepted();
}

}  // namespace idemsaga::orchestrator
