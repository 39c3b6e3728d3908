#include "orchestrator/saga_service.hpp"

#include <boost/asio/post.hpp>
#include <cmath>
#include <future>

#include "common/http/server.hpp"
#include "common/log.hpp"
#include "common/percent_encode.hpp"
#include "common/pg/errors.hpp"
#include "orchestrator/response.hpp"

namespace orchestrator {
namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json StepsJson(const std::vector<saga::StepRecord>& steps) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& s : steps) j.push_back(s.ToJson());
  return j;
}

// The runner's durable side: the parent row, written only under this saga's lease.
class StoreJournal : public saga::Journal {
 public:
  // `cancel`: set by SagaService::Cancel while the saga runs in this process.
  StoreJournal(ParentStore& store, EventStore& events, const Claim& claim,
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

  ParkResult Park(const std::vector<saga::StepRecord>& steps,
                  std::chrono::milliseconds wake_in) override {
    return store_.Park(lease_, StepsJson(steps), wake_in) ? ParkResult::kParked
                                                          : ParkResult::kFenced;
  }

  std::optional<saga::ReceivedEvent> Event(const std::vector<std::string>& names) override {
    return events_.Take(lease_.tenant_id, lease_.key, names);
  }

  AwaitResult AwaitEvent(const std::vector<saga::StepRecord>& steps,
                         const std::vector<std::string>& names,
                         std::chrono::milliseconds wake_in) override {
    switch (store_.ParkForEvents(lease_, StepsJson(steps), names, wake_in)) {
      case ParentStore::AwaitOutcome::kParked:
        return AwaitResult::kParked;
      case ParentStore::AwaitOutcome::kFenced:
        return AwaitResult::kFenced;
      case ParentStore::AwaitOutcome::kArrived:
        renewed_at_ = Clock::now();
        return AwaitResult::kArrived;
    }
    return AwaitResult::kFenced;
  }

  bool BeginCompensation(const std::vector<saga::StepRecord>& steps, const saga::StepResult& cause,
                         const std::string& failed_step) override {
    return store_.BeginCompensation(lease_, StepsJson(steps), failed_step, FailureToJson(cause));
  }

  bool DeferStuck(const std::vector<saga::StepRecord>& steps,
                  std::chrono::milliseconds retry_in) override {
    return store_.DeferStuck(lease_, StepsJson(steps), retry_in);
  }

 private:
  ParentStore& store_;
  EventStore& events_;
  Lease lease_;
  Clock::time_point renewed_at_;
  std::shared_ptr<std::atomic<bool>> cancel_;
};

// A 503 is an outage: the client is told when to retry (with the same key, which is safe).
Answer Error(int status, const std::string& code, const std::string& message) {
  Answer a{status,
           common::http::ProblemBody(status, code, message),
           {{"Content-Type", common::http::kProblemContentType}}};
  if (status == 503) a.headers["Retry-After"] = "1";
  return a;
}

// What the runner needs from a stored row. Throws nlohmann::json::exception on a row whose
// JSON does not have the expected shape.
saga::SagaInput InputOf(const SagaRow& row, bool resumed) {
  saga::SagaInput input;
  input.tenant_id = row.tenant_id;
  input.parent_key = row.key;
  input.request = row.request_body;
  input.trace_id = row.trace_id;
  input.root_span_id = row.root_span_id;
  input.resumed = resumed;
  std::vector<saga::StepRecord> steps;
  for (const auto& s : row.steps) steps.push_back(saga::StepRecord::FromJson(s));
  if (row.status == SagaStatus::kCompensating) {
    input.compensating = std::move(steps);
    input.failure = FailureFromJson(row.failure);
    input.failed_step = row.failed_step;
  } else if (!steps.empty()) {
    input.checkpoint = std::move(steps);  // parked, or deferred while running
  }
  return input;
}

// What a request whose saga threw past Drive gets: a 503 for an outage (a retry with the
// same key is safe), else a 500.
Answer Unanswered(const std::exception_ptr& e) {
  auto failure = common::pg::Classify(e);
  common::Log("saga_answer_failed", {{"error", failure.what}});
  if (failure.kind == common::pg::Failure::kUnavailable) {
    return Error(503, "unavailable",
                 "the database is unavailable; retrying with the same key is safe");
  }
  return Error(500, "internal_error", "internal error");
}

Answer InProgress(const SagaRow& row) {
  Answer a = Error(409, "idempotency_key_in_progress",
                   "a request with this Idempotency-Key is still being processed; retry later");
  int seconds = std::max(1, static_cast<int>(std::ceil(std::min(row.lease_seconds_left, 5.0))));
  a.headers["Retry-After"] = std::to_string(seconds);
  return a;
}

}  // namespace

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

nlohmann::json FailureToJson(const saga::StepResult& r) {
  return {{"outcome", saga::ToString(r.outcome)},
          {"http_status", r.http_status},
          {"error_code", r.error_code},
          {"detail", r.detail}};
}

saga::StepResult FailureFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return saga::StepResult::Retryable("unknown");
  if (j.value("outcome", "") == "terminal") {
    return saga::StepResult::Terminal(j.value("http_status", 0), j.value("error_code", ""),
                                      j.value("detail", ""));
  }
  auto r = saga::StepResult::InDoubt(j.value("detail", ""));
  r.http_status = j.value("http_status", 0);
  return r;
}

SagaService::SagaService(ParentStore& store, EventStore& events, const saga::Registry& registry,
                         saga::RetryPolicy policy, SagaServiceOptions options,
                         const common::trace::Tracer* tracer, common::metrics::Registry* metrics)
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

Answer SagaService::Counted(Answer a) {
  if (a.outcome != KeyOutcome::kNone) key_outcomes_.With({ToString(a.outcome)}).Inc();
  return a;
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

namespace {

// Takes one off a count when the scope ends, however it ends.
struct CountDown {
  std::atomic<long long>& n;
  ~CountDown() { --n; }
};

Answer ReplayOf(const FinishedAnswer& f) {
  Answer a{f.status, f.body, f.headers};
  a.headers["Idempotent-Replayed"] = "true";
  a.outcome = KeyOutcome::kReplayed;
  a.trace_id = f.trace_id;
  a.root_span_id = f.root_span_id;
  return a;
}

Answer Mismatch() {
  Answer a = Error(422, "idempotency_key_reused",
                   "this Idempotency-Key was used with a different request body");
  a.outcome = KeyOutcome::kMismatch;
  return a;
}

}  // namespace

FinishedAnswer SagaService::Remember(const SagaRow& row, int status, const std::string& body,
                                     std::map<std::string, std::string> headers,
                                     std::chrono::milliseconds row_expires_in) {
  FinishedAnswer answer{row.request_hash, status,           body,
                        row.trace_id,     row.root_span_id, std::move(headers)};
  finished_.Put(row.tenant_id, row.key, answer, row_expires_in);
  return answer;
}

Answer SagaService::Replay(const SagaRow& row) {
  std::map<std::string, std::string> headers;
  if (row.response_headers.is_object()) {
    for (const auto& [name, value] : row.response_headers.items()) {
      if (value.is_string()) headers[name] = value.get<std::string>();
    }
  }
  return ReplayOf(
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

bool SagaService::Queue(const Claim& claim, std::chrono::milliseconds wake_in, const char* reason) {
  if (!store_.Park(claim.lease, claim.row.steps, wake_in)) return false;
  common::Log("saga_queued", {{"tenant", claim.row.tenant_id},
                              {"key", claim.row.key},
                              {"reason", reason},
                              {"trace_id", claim.row.trace_id}});
  return true;
}

Answer SagaService::Drive(const Claim& claim, std::shared_ptr<const std::any> typed,
                          std::chrono::steady_clock::time_point answer_by) {
  // running_ was counted when the saga was posted, so queued sagas count as running too.
  CountDown done{running_};
  const SagaRow& row = claim.row;
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
    const saga::Definition* definition = registry_.Find(row.saga_name, row.saga_version);
    if (definition == nullptr) {
      common::Log("saga_definition_missing", {{"tenant", row.tenant_id},
                                              {"key", row.key},
                                              {"saga", row.saga_name},
                                              {"version", std::to_string(row.saga_version)},
                                              {"trace_id", row.trace_id}});
      store_.DeferStuck(claim.lease, row.steps, policy_.stuck_retry_interval);
      return Error(503, "unavailable",
                   "this saga's definition is not served by this build; retry later");
    }
    saga::SagaInput input;
    try {
      input = InputOf(row, claim.kind == Claim::kTakenOver);
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
      store_.DeferStuck(claim.lease, row.steps, policy_.stuck_retry_interval);
      return Error(503, "unavailable", "the order cannot be resumed now; retry later");
    }
    saga::Runner runner(
        *definition, policy_, [this](std::chrono::milliseconds d) { SleepUnlessStopping(d); },
        [this] { return stopping_.load(); }, tracer_, &runner_metrics_, {}, options_.at_boundary);
    auto started = std::chrono::steady_clock::now();
    saga::SagaResult result = runner.Run(std::move(input), journal);
    durations_.With({definition->name(), saga::ToString(result.end)})
        .Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (result.end == saga::SagaEnd::kAbandoned) {
      return Error(503, "unavailable", "the service is shutting down; retry with the same key");
    }
    if (result.end == saga::SagaEnd::kParked || result.end == saga::SagaEnd::kDeferred) {
      // Set aside, for recovery to resume: parked (waiting with no thread held, until its
      // wake-up time) or stuck (a compensation keeps failing, or a step is blocked on a
      // configuration fault). The caller polls the saga, or retries the key (409 until then).
      bool parked = result.end == saga::SagaEnd::kParked;
      nlohmann::json body = {
          {"status",
           ToString(result.failed_step.empty() ? SagaStatus::kStarted : SagaStatus::kCompensating)},
          {parked ? "waiting" : "stuck", true},
          {"order_id", row.order_id},
          {"idempotency_key", row.key},
          {"trace_id", row.trace_id}};
      if (!result.waiting_for.empty()) body["waiting_for"] = result.waiting_for;
      return Answer{202, body.dump(), {{"Location", StatusPath(row.saga_name, row.key)}}};
    }
    if (result.end == saga::SagaEnd::kCompleted || result.end == saga::SagaEnd::kFailed) {
      auto response = BuildResponse(
          result, {row.order_id, row.key, row.trace_id, StatusPath(row.saga_name, row.key)});
      bool completed = result.end == saga::SagaEnd::kCompleted;
      if (store_.Finish(claim.lease, completed, response.status, response.body,
                        StepsJson(result.steps), response.headers)) {
        if (options_.at_boundary) options_.at_boundary("after_finish");
        // Not remembered yet: most keys are never sent again, and copying every answer into
        // memory cost each order an allocation burst and the cache its whole budget. The
        // first replay reads the row (Replay remembers it); a storm after it comes from memory.
        common::Log("saga_finished",
                    {{"tenant", row.tenant_id},
                     {"key", row.key},
                     {"status", ToString(completed ? SagaStatus::kCompleted : SagaStatus::kFailed)},
                     {"http_status", std::to_string(response.status)},
                     {"trace_id", row.trace_id}});
        return Answer{response.status, response.body, response.headers};
      }
    }
    // Fenced: another owner has the saga now; answer from what it has stored, if anything.
    auto now = store_.Get(row.tenant_id, row.key);
    if (now && !now->response_body.empty()) return Replay(*now);
    return InProgress(now.value_or(row));
  } catch (...) {
    // The database (or a bug) stopped us mid-saga: nothing final was stored; the lease
    // expires and a retry or the sweeper resumes with the same derived keys. Only an outage
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
      return Error(500, "internal_error",
                   "the order stopped on an internal error; nothing final was stored");
    }
    return Error(503, "unavailable",
                 "the order could not be completed now; retry with the same key");
  }
}

SagaService::CancelResult SagaService::Cancel(const SagaRow& row, const std::string& operator_name,
                                              const std::string& reason) {
  if (row.status == SagaStatus::kCompleted || row.status == SagaStatus::kFailed) {
    return CancelResult::kEnded;
  }
  if (row.status == SagaStatus::kCompensating) return CancelResult::kAlreadyCompensating;
  nlohmann::json request = {{"operator", operator_name}, {"reason", reason}};
  if (!store_.RequestCancel(row.tenant_id, row.key, request)) {
    // It moved on meanwhile: ended, or compensating after all.
    auto now = store_.Get(row.tenant_id, row.key);
    return now && now->status == SagaStatus::kCompensating ? CancelResult::kAlreadyCompensating
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

std::optional<std::string> SagaService::Resolve(const SagaRow& row,
                                                const std::string& operator_name,
                                                const std::string& note) {
  if (row.status != SagaStatus::kCompensating || !row.stuck) return std::nullopt;
  // The stuck compensation is the first still to be undone in the order they run (the
  // reverse of the order the steps ended); the ones after it are the saga's to run.
  nlohmann::json steps = row.steps;
  std::vector<saga::StepRecord> records;
  for (const auto& s : steps) records.push_back(saga::StepRecord::FromJson(s));
  const saga::Definition* definition = registry_.Find(row.saga_name, row.saga_version);
  for (size_t i : saga::UndoOrder(records, definition)) {
    auto& step = records[i];
    if (step.status != saga::StepStatus::kCompensating) continue;
    // A child saga's stuck compensation is one of its own steps: marking the whole child
    // undone would leave its other compensations unsent. Not resolvable by hand here.
    if (definition != nullptr && i < definition->steps().size() &&
        definition->steps()[i].kind == saga::StepKind::kChild) {
      return std::nullopt;
    }
    step.status = saga::StepStatus::kCompensated;
    step.detail = "compensated by hand (";
    step.detail.append(operator_name).append("): ").append(note);
    steps[i] = step.ToJson();
    nlohmann::json resolution = {{"operator", operator_name}, {"note", note}, {"step", step.name}};
    if (!store_.Resolve(row.tenant_id, row.key, resolution, steps)) return std::nullopt;
    return step.name;
  }
  return std::nullopt;
}

bool SagaService::ResumeAsync(const Claim& claim) {
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

Answer SagaService::Submit(const Submission& s) {
  if (stopping_) return Error(503, "unavailable", "the service is shutting down");
  const ClaimRequest& req = s.request;
  if (auto done = finished_.Get(req.tenant_id, req.key)) {
    if (req.Matches(done->request_hash)) return Counted(ReplayOf(*done));
    Answer a = Mismatch();
    a.trace_id = done->trace_id;
    a.root_span_id = done->root_span_id;
    return Counted(std::move(a));
  }
  ClaimRequest claiming = req;
  claiming.saga_name = s.definition->name();
  claiming.saga_version = s.definition->version();
  claiming.owner = options_.owner;
  Claim claim = store_.ClaimKey(claiming);
  Answer answer = AnswerClaim(claim, s);
  answer.trace_id = claim.row.trace_id;
  answer.root_span_id = claim.row.root_span_id;
  return Counted(std::move(answer));
}

Answer SagaService::AnswerClaim(const Claim& claim, const Submission& s) {
  if (claim.kind == Claim::kClaimed && options_.at_boundary) options_.at_boundary("after_claim");
  switch (claim.kind) {
    case Claim::kMismatch:
      return Mismatch();
    case Claim::kFinished:
      return Replay(claim.row);
    case Claim::kInProgress: {
      Answer a = InProgress(claim.row);
      a.outcome = KeyOutcome::kInProgress;
      return a;
    }
    case Claim::kClaimed:
    case Claim::kTakenOver:
      break;
  }
  common::Log(claim.kind == Claim::kClaimed ? "saga_started" : "saga_resumed",
              {{"tenant", s.request.tenant_id},
               {"key", s.request.key},
               {"order_id", claim.row.order_id},
               {"trace_id", claim.row.trace_id}});
  ++running_;
  // A takeover resumes the definition the key started with: the route's typed input is for
  // the latest one, so the runner parses the stored request itself.
  auto input = claim.kind == Claim::kClaimed ? s.input : nullptr;
  auto outcome = claim.kind == Claim::kClaimed ? KeyOutcome::kClaimed : KeyOutcome::kTakenOver;
  // What a request still waiting after the response budget gets: the saga goes on.
  auto accepted = [outcome, order_id = claim.row.order_id, trace_id = claim.row.trace_id,
                   root_span_id = claim.row.root_span_id, key = s.request.key,
                   saga = s.definition->name()] {
    nlohmann::json body = {{"status", ToString(SagaStatus::kStarted)},
                           {"order_id", order_id},
                           {"idempotency_key", key},
                           {"trace_id", trace_id}};
    Answer a{202, body.dump(), {{"Location", StatusPath(saga, key)}}};
    a.outcome = outcome;
    a.trace_id = trace_id;
    a.root_span_id = root_span_id;
    return a;
  };
  // Queued before anything runs when its tenant has its fill running here: answered 202,
  // started by recovery once a slot is free.
  if (!TakeTenantSlot(s.request.tenant_id)) {
    --running_;
    if (!Queue(claim, std::chrono::milliseconds(0), "tenant_limit")) return InProgress(claim.row);
    return accepted();
  }
  if (s.answer_early && ++running_inline_ <= static_cast<long long>(options_.inline_limit)) {
    CountDown done{running_inline_};
    // On the request's own thread: handing the saga to the pool and waiting for it cost four
    // context switches per order (19 of the dev process's, 15 without).
    auto answer_by = std::chrono::steady_clock::now() + options_.response_budget;
    auto late =
        budget_watch_.Add(answer_by, [send = s.answer_early, accepted] { send(accepted()); });
    Answer a = Drive(claim, input, answer_by);
    a.outcome = outcome;
    return a;
  }
  if (s.answer_early) --running_inline_;  // over the limit: the pool's
  if (running_.load() - running_inline_.load() > static_cast<long long>(options_.threads)) {
    // Every thread is taken: the saga waits durably instead of holding this request's worker
    // (a worker held for the response budget is how one slow participant used to turn every
    // route into 503s). Its lease runs out now; recovery starts it when a thread is free.
    --running_;
    GiveTenantSlot(s.request.tenant_id);
    if (!Queue(claim, std::chrono::milliseconds(0), "threads")) {
      return InProgress(claim.row);  // fenced: another owner has it already
    }
    return accepted();
  }
  if (s.answer_early) {
    // The request's worker does not wait for the pool: the saga's thread sends its answer, or
    // the budget watch a 202, whichever comes first. A worker waiting on a saga held up by a
    // slow participant is how that participant used to turn every route into 503s.
    auto late = budget_watch_.Add(std::chrono::steady_clock::now() + options_.response_budget,
                                  [send = s.answer_early, accepted] { send(accepted()); });
    boost::asio::post(*pool_, [this, claim, input, outcome, send = s.answer_early, late] {
      Answer a;
      try {
        a = Drive(claim, input);
      } catch (...) {  // Drive catches what it can; anything else must still answer
        a = Unanswered(std::current_exception());
      }
      a.outcome = outcome;
      send(a);
    });
    Answer later = accepted();
    later.deferred = true;
    return later;
  }
  auto promise = std::make_shared<std::promise<Answer>>();
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
    Answer a = future.get();
    a.outcome = outcome;
    return a;
  }
  return accepted();
}

}  // namespace orchestrator
