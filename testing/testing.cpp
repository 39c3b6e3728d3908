// The test kit (include/idemsaga/testing.hpp): the real runner over fake participants, an
// in-memory journal shaped as the orchestrator's row, and a virtual clock.
#include "idemsaga/testing.hpp"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <stdexcept>

#include "common/strings.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::testing {
namespace {

using std::chrono::milliseconds;

// Thrown at a crash point: not a std::exception, so that neither a step's call (Call counts a
// std::exception as in doubt) nor anything else in the engine takes it for an answer. It
// unwinds the run as a kill -9 ends it: nothing more is written or sent.
struct Crashed {};

}  // namespace

// What one environment's participants, journal and clock share, under one mutex.
struct detail::World {
  std::mutex mu;
  long long start_ms = 0;
  long long now_ms = 0;
  std::vector<Call> calls;

  // Crash points: counted through the run; the run dies at the crash_at-th (0: never).
  int crash_at = 0;
  int points = 0;
  std::vector<std::string> where;
  bool crashed = false;
  std::string last_key;  // of the last call, to name a boundary

  // Events: delivered (kept, the first of a name wins), and scheduled for a virtual time.
  std::vector<saga::ReceivedEvent> delivered;
  std::vector<std::pair<long long, saga::ReceivedEvent>> scheduled;

  void DeliverLocked(const std::string& name, nlohmann::json payload) {
    for (const auto& e : delivered) {
      if (e.name == name) return;
    }
    delivered.push_back({name, std::move(payload)});
  }
  void AdvanceLocked(milliseconds d) {
    if (d.count() > 0) now_ms += d.count();
    // Delivered in the order they fall due (stable for equal times: the order sent).
    std::stable_sort(scheduled.begin(), scheduled.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    while (!scheduled.empty() && scheduled.front().first <= now_ms) {
      DeliverLocked(scheduled.front().second.name, scheduled.front().second.payload);
      scheduled.erase(scheduled.begin());
    }
  }
  void AliveLocked() const {
    if (crashed) throw Crashed{};
  }
  void PointLocked(std::string what) {
    ++points;
    where.push_back(std::move(what));
    if (crash_at == points) {
      crashed = true;
      throw Crashed{};
    }
  }
};

// ---- Reply ----

Reply Reply::Success(nlohmann::json output) {
  Reply r;
  r.kind = Kind::kSuccess;
  r.output = std::move(output);
  r.status = 201;
  return r;
}

Reply Reply::Refusal(int status, std::string code, std::string detail) {
  Reply r;
  r.kind = Kind::kRefusal;
  r.status = status;
  r.detail = detail.empty() ? "HTTP " + std::to_string(status) + " " + code : std::move(detail);
  r.code = std::move(code);
  return r;
}

Reply Reply::Retryable(milliseconds retry_after, int status) {
  Reply r;
  r.kind = Kind::kRetryable;
  r.status = status;
  r.retry_after = retry_after;
  r.detail = "HTTP " + std::to_string(status);
  return r;
}

Reply Reply::InDoubt(bool applied) {
  Reply r;
  r.kind = Kind::kInDoubt;
  r.applied = applied;
  r.detail = "sent, no answer";
  return r;
}

Reply Reply::Blocked(int status, std::string detail) {
  Reply r;
  r.kind = Kind::kBlocked;
  r.status = status;
  r.detail = std::move(detail);
  return r;
}

Reply Reply::After(milliseconds d) const {
  Reply r = *this;
  r.delay = d;
  return r;
}

// ---- FakeParticipant ----

struct FakeParticipant::Impl {
  std::string name;
  std::shared_ptr<detail::World> shared;
  std::map<std::string, std::vector<Reply>> scripts;
  std::map<std::string, size_t> taken;  // replies used, by key
  std::optional<nlohmann::json> default_output;
  bool guarded = true;
  struct Stored {
    std::string request;  // path and body
    StepResult answer;
  };
  std::map<std::string, Stored> stored;
  std::map<std::string, int> applied;

  nlohmann::json DefaultOutput(const std::string& key, CallKind kind) const {
    if (kind == CallKind::kCompensation) return {{"undone", true}};
    if (default_output) return *default_output;
    return {{name + "_id", key}};
  }

  StepResult Answer(const std::string& path, const StepContext& ctx, const nlohmann::json& body,
                    CallKind kind) {
    std::lock_guard lock(shared->mu);
    shared->AliveLocked();
    const std::string& key = ctx.derived_key;
    Call call{.participant = name,
              .path = path,
              .step = ctx.step_name,
              .derived_key = key,
              .body = body,
              .attempt = ctx.attempt,
              .kind = kind};
    const std::string request = path + "\n" + body.dump();
    StepResult result = StepResult::Retryable("unanswered");
    bool applies = false;
    auto known = guarded ? stored.find(key) : stored.end();
    if (known != stored.end()) {
      if (known->second.request == request) {
        result = known->second.answer;
        result.replayed = true;
        call.replayed = true;
      } else {
        // What the HTTP client makes of the guard's 422 idempotency_key_reused.
        result = StepResult::Blocked(
            422,
            "HTTP 422 idempotency_key_reused (step_request_changed): this step's request "
            "differs from the one first sent under " +
                key +
                "; a step's request must be a pure function of the saga's input and "
                "earlier outputs");
        result.error_code = "step_request_changed";
      }
    } else {
      Reply reply = Reply::Success();
      if (auto s = scripts.find(key); s != scripts.end() && !s->second.empty()) {
        size_t& n = taken[key];
        reply = s->second[std::min(n, s->second.size() - 1)];
        ++n;
      }
      if (reply.kind == Reply::Kind::kSuccess && reply.output.is_null()) {
        reply.output = DefaultOutput(key, kind);
      }
      const bool timed_out = ctx.call_timeout.count() > 0 && reply.delay > ctx.call_timeout;
      shared->AdvanceLocked(timed_out ? ctx.call_timeout : reply.delay);
      std::optional<StepResult> keep;  // the answer the guard stores for the key
      switch (reply.kind) {
        case Reply::Kind::kSuccess:
          result = StepResult::Succeeded(reply.output);
          result.http_status = reply.status;
          applies = true;
          keep = result;
          break;
        case Reply::Kind::kRefusal:
          result = StepResult::Terminal(reply.status, reply.code, reply.detail);
          keep = result;
          break;
        case Reply::Kind::kRetryable:
          result = StepResult::Retryable(reply.detail, reply.status);
          result.retry_after = reply.retry_after;
          break;
        case Reply::Kind::kInDoubt:
          result = StepResult::InDoubt(reply.detail);
          if (reply.applied) {
            applies = true;
            keep = StepResult::Succeeded(DefaultOutput(key, kind));
            keep->http_status = 201;
          }
          break;
        case Reply::Kind::kBlocked:
          result = StepResult::Blocked(reply.status, reply.detail);
          break;
      }
      if (timed_out && result.outcome != Outcome::kInDoubt) {
        // The participant answers after the caller gave up: done there, unknown here.
        result = StepResult::InDoubt("no answer within the call timeout of " +
                                     std::to_string(ctx.call_timeout.count()) + " ms");
      }
      if (applies) ++applied[key];
      if (keep && guarded) stored[key] = {request, *keep};
    }
    call.answer = result.outcome;
    call.at = milliseconds(shared->now_ms - shared->start_ms);
    shared->calls.push_back(call);
    shared->last_key = key;
    shared->PointLocked("in " + key + " (attempt " + std::to_string(ctx.attempt) + "), " +
                        (call.replayed ? "replayed"
                         : applies     ? "applied"
                                       : "answered") +
                        ", its answer lost");
    return result;
  }
};

FakeParticipant::FakeParticipant(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FakeParticipant::~FakeParticipant() = default;

FakeParticipant& FakeParticipant::Script(const std::string& derived_key,
                                         std::vector<Reply> replies) {
  std::lock_guard lock(impl_->shared->mu);
  impl_->scripts[derived_key] = std::move(replies);
  impl_->taken.erase(derived_key);
  return *this;
}

FakeParticipant& FakeParticipant::DefaultOutput(nlohmann::json output) {
  std::lock_guard lock(impl_->shared->mu);
  impl_->default_output = std::move(output);
  return *this;
}

FakeParticipant& FakeParticipant::Unguarded() {
  std::lock_guard lock(impl_->shared->mu);
  impl_->guarded = false;
  return *this;
}

std::map<std::string, int> FakeParticipant::Applied() const {
  std::lock_guard lock(impl_->shared->mu);
  return impl_->applied;
}

const std::string& FakeParticipant::name() const { return impl_->name; }

StepResult FakeParticipant::Post(const std::string& path, const StepContext& ctx,
                                 const nlohmann::json& body) {
  return impl_->Answer(path, ctx, body, CallKind::kAction);
}

StepResult FakeParticipant::Compensate(const std::string& path, const StepContext& ctx) {
  // What the product's client sends (steps/client/participant_client.cpp).
  return impl_->Answer(path, ctx,
                       {{"action_key", ctx.action_key}, {"action_applied", ctx.action_confirmed}},
                       CallKind::kCompensation);
}

// ---- FakeParticipants ----

FakeParticipants::FakeParticipants() : shared_(std::make_shared<detail::World>()) {}
FakeParticipants::~FakeParticipants() = default;

FakeParticipant& FakeParticipants::Add(const std::string& name) {
  auto& p = participants_[name];
  if (!p) {
    auto impl = std::make_unique<FakeParticipant::Impl>();
    impl->name = name;
    impl->shared = shared_;
    p.reset(new FakeParticipant(std::move(impl)));
  }
  return *p;
}

ParticipantClient& FakeParticipants::Get(const std::string& name) const {
  auto it = participants_.find(name);
  if (it == participants_.end()) {
    throw std::out_of_range("participant '" + name +
                            "' is not added to the test's FakeParticipants (Add it first)");
  }
  return *it->second;
}

bool FakeParticipants::Has(const std::string& name) const { return participants_.count(name) != 0; }

std::vector<Call> FakeParticipants::Calls() const {
  std::lock_guard lock(shared_->mu);
  return shared_->calls;
}

std::map<std::string, int> FakeParticipants::Effects() const {
  std::lock_guard lock(shared_->mu);
  std::map<std::string, int> out;
  for (const auto& [name, p] : participants_) {
    for (const auto& [key, n] : p->impl_->applied) out[name + " " + key] = n;
  }
  return out;
}

// ---- Result ----

const char* ToString(End end) {
  switch (end) {
    case End::kCompleted:
      return "completed";
    case End::kFailed:
      return "failed";
    case End::kStuck:
      return "stuck";
  }
  return "unknown";
}

const StepRecord* Result::Step(const std::string& name) const {
  for (const auto& s : steps) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::vector<Call> Result::CallsOf(const std::string& derived_key) const {
  std::vector<Call> out;
  for (const auto& c : calls) {
    if (c.derived_key == derived_key) out.push_back(c);
  }
  return out;
}

std::vector<std::string> Result::CallKeys() const {
  std::vector<std::string> out;
  for (const auto& c : calls) out.push_back(c.derived_key);
  return out;
}

// ---- The journal ----

namespace {

using Shared = detail::World;

// The orchestrator's row for the run, as far as the runner writes it.
struct Row {
  bool compensating = false;
  nlohmann::json steps = nlohmann::json::array();  // records as stored (StepRecord::ToJson)
  std::optional<StepResult> failure;
  std::string failed_step;
  milliseconds wake_in{0};  // of the last park or deferral
  std::vector<std::string> awaiting;
  std::map<std::string, std::string> taken;  // an event wait's names -> the event it took
};

nlohmann::json StepsJson(const std::vector<saga::StepRecord>& steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : steps) out.push_back(s.ToJson());
  return out;
}

class KitJournal : public saga::Journal {
 public:
  KitJournal(Shared& shared, Row& row) : shared_(shared), row_(row) {}

  bool KeepLease() override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    return true;
  }
  bool BeginCompensation(const std::vector<saga::StepRecord>& steps, const StepResult& cause,
                         const std::string& failed_step) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.compensating = true;
    row_.steps = StepsJson(steps);
    row_.failure = cause;
    row_.failed_step = failed_step;
    shared_.PointLocked("after the decision to compensate (" + failed_step + ") was stored");
    return true;
  }
  bool CancelRequested() override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    shared_.PointLocked("at a step boundary after " +
                        (shared_.last_key.empty() ? std::string("the start") : shared_.last_key));
    return false;
  }
  bool DeferStuck(const std::vector<saga::StepRecord>& steps, milliseconds retry_in) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.steps = StepsJson(steps);
    row_.wake_in = retry_in;
    row_.awaiting.clear();
    return true;
  }
  ParkResult Park(const std::vector<saga::StepRecord>& steps, milliseconds wake_in) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.steps = StepsJson(steps);
    row_.wake_in = wake_in;
    row_.awaiting.clear();
    return ParkResult::kParked;
  }
  std::optional<saga::ReceivedEvent> Event(const std::vector<std::string>& names) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    const std::string wait = common::Join(names, " ");
    if (auto t = row_.taken.find(wait); t != row_.taken.end()) {
      for (const auto& e : shared_.delivered) {
        if (e.name == t->second) return e;
      }
    }
    for (const auto& e : shared_.delivered) {
      if (std::find(names.begin(), names.end(), e.name) != names.end()) {
        row_.taken[wait] = e.name;
        return e;
      }
    }
    return std::nullopt;
  }
  AwaitResult AwaitEvent(const std::vector<saga::StepRecord>& steps,
                         const std::vector<std::string>& names, milliseconds wake_in) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.steps = StepsJson(steps);
    row_.wake_in = wake_in;
    row_.awaiting = names;
    for (const auto& e : shared_.delivered) {
      if (std::find(names.begin(), names.end(), e.name) != names.end()) {
        return AwaitResult::kArrived;  // came while parking: this owner goes on
      }
    }
    return AwaitResult::kParked;
  }

 private:
  Shared& shared_;
  Row& row_;
};

saga::RetryPolicy EnginePolicy(const Policy& p) {
  saga::RetryPolicy r;
  r.max_attempts = p.max_attempts;
  r.initial_backoff = p.initial_backoff;
  r.max_backoff = p.max_backoff;
  r.step_deadline = p.step_deadline;
  r.compensation_stuck_after = p.compensation_stuck_after;
  r.stuck_retry_interval = p.stuck_retry_interval;
  r.park_after = p.park_after;
  return r;
}

std::string ProblemTitle(const std::string& code) {
  std::string title = code;
  for (char& ch : title) {
    if (ch == '_') ch = ' ';
  }
  if (!title.empty())
    title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
  return title;
}

// The answer orchestrator/response.cpp (BuildResponse) stores for a finished saga.
void Answer(const saga::SagaResult& r, const RunOptions& o, Result& out) {
  if (r.end == saga::SagaEnd::kCompleted && r.answer) {
    out.status = r.answer->status;
    out.body = r.answer->body;
    return;
  }
  if (r.end == saga::SagaEnd::kCompleted) {
    nlohmann::json body = nlohmann::json::object();
    for (const auto& [step, output] : r.outputs.items()) {
      if (!output.is_object()) continue;
      for (const auto& [field, value] : output.items()) {
        if (field.size() > 3 && field.compare(field.size() - 3, 3, "_id") == 0) body[field] = value;
      }
    }
    body["status"] = "completed";
    body["order_id"] = o.order_id;
    body["idempotency_key"] = o.key;
    body["trace_id"] = o.trace_id;
    out.status = 201;
    out.body = std::move(body);
    return;
  }
  const StepResult& f = r.failure;
  const bool business =
      f.outcome == Outcome::kTerminal && f.http_status >= 400 && f.http_status < 500;
  const int status = business ? f.http_status : 502;
  const std::string code =
      business && !f.error_code.empty() ? f.error_code : r.failed_step + "_unavailable";
  const std::string detail = business ? f.detail
                                      : "the " + r.failed_step +
                                            " step did not answer in time; completed steps were "
                                            "compensated; send a new Idempotency-Key to try again";
  out.status = status;
  out.body = {{"type", "https://idemsaga.dev/problems/" + code},
              {"title", ProblemTitle(code)},
              {"status", status},
              {"detail", detail},
              {"code", code},
              {"saga_status", "failed"},
              {"step", r.failed_step},
              {"compensated", r.compensated},
              {"retryable", false},
              {"order_id", o.order_id},
              {"idempotency_key", o.key},
              {"trace_id", o.trace_id}};
}

}  // namespace

// ---- Environment ----

struct Environment::Impl {
  RunOptions options;
  FakeParticipants participants;
  std::shared_ptr<Shared> shared = participants.shared_;
  Row row;
};

Environment::Environment(RunOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  std::lock_guard lock(impl_->shared->mu);
  impl_->shared->start_ms = impl_->options.start_unix_ms;
  impl_->shared->now_ms = impl_->options.start_unix_ms;
}

Environment::~Environment() = default;

FakeParticipants& Environment::participants() { return impl_->participants; }

void Environment::Send(const std::string& event, nlohmann::json payload) {
  std::lock_guard lock(impl_->shared->mu);
  impl_->shared->DeliverLocked(event, std::move(payload));
}

void Environment::SendAfter(milliseconds after, const std::string& event, nlohmann::json payload) {
  std::lock_guard lock(impl_->shared->mu);
  auto& s = *impl_->shared;
  s.scheduled.push_back({s.start_ms + after.count(), {event, std::move(payload)}});
  s.AdvanceLocked(milliseconds(0));  // already due: delivered now
}

std::chrono::system_clock::time_point Environment::Now() const {
  std::lock_guard lock(impl_->shared->mu);
  return std::chrono::system_clock::time_point(milliseconds(impl_->shared->now_ms));
}

milliseconds Environment::Elapsed() const {
  std::lock_guard lock(impl_->shared->mu);
  return milliseconds(impl_->shared->now_ms - impl_->shared->start_ms);
}

Result Environment::Run(const Definition& definition, const nlohmann::json& input) {
  Impl& env = *impl_;
  Shared& shared = *env.shared;
  const RunOptions& o = env.options;
  env.row = Row{};
  const auto typed = definition.ParseInput(input);  // InvalidInput: the route's 400
  size_t first_call = 0;
  long long started_ms = 0;
  {
    std::lock_guard lock(shared.mu);
    first_call = shared.calls.size();
    started_ms = shared.now_ms;
  }
  saga::Runner runner(
      definition, EnginePolicy(o.policy),
      [&shared](milliseconds d) {
        std::lock_guard lock(shared.mu);
        shared.AdvanceLocked(d);
      },
      {}, nullptr, nullptr,
      [&shared] {
        std::lock_guard lock(shared.mu);
        return std::chrono::system_clock::time_point(milliseconds(shared.now_ms));
      });
  KitJournal journal(shared, env.row);
  Result out;
  int stuck = 0;
  constexpr int kMostRuns = 10000;  // a saga that never ends is a bug in it (or here)
  for (bool first = true;; first = false) {
    if (++out.runs > kMostRuns) {
      throw std::logic_error("the saga was resumed " + std::to_string(kMostRuns) +
                             " times without ending");
    }
    saga::SagaInput in;
    in.tenant_id = o.tenant;
    in.parent_key = o.key;
    in.request = input;
    in.trace_id = o.trace_id;
    in.root_span_id = std::string(16, 'b');
    in.resumed = !first;
    in.typed = typed;
    // As orchestrator/saga_service.cpp (InputOf) reads the row back.
    std::vector<saga::StepRecord> steps;
    for (const auto& s : env.row.steps) steps.push_back(saga::StepRecord::FromJson(s));
    if (env.row.compensating) {
      in.compensating = std::move(steps);
      in.failure = env.row.failure;
      in.failed_step = env.row.failed_step;
    } else if (!steps.empty()) {
      in.checkpoint = std::move(steps);
    }
    saga::SagaResult r;
    try {
      r = runner.Run(std::move(in), journal);
    } catch (const Crashed&) {
      // Killed: what the journal persisted stays, and a new owner takes the saga over.
      std::lock_guard lock(shared.mu);
      shared.crashed = false;
      shared.crash_at = 0;
      continue;
    }
    if (r.end == saga::SagaEnd::kParked) {
      std::lock_guard lock(shared.mu);
      // Woken at its wake-up time, or by an awaited event scheduled before then.
      long long wake = shared.now_ms + env.row.wake_in.count();
      for (const auto& [at, e] : shared.scheduled) {
        if (std::find(env.row.awaiting.begin(), env.row.awaiting.end(), e.name) !=
            env.row.awaiting.end()) {
          wake = std::min(wake, at);
        }
      }
      shared.AdvanceLocked(milliseconds(std::max(0LL, wake - shared.now_ms)));
      continue;
    }
    if (r.end == saga::SagaEnd::kDeferred && stuck++ < o.stuck_retries) {
      std::lock_guard lock(shared.mu);
      shared.AdvanceLocked(env.row.wake_in);
      continue;
    }
    if (r.end == saga::SagaEnd::kFenced || r.end == saga::SagaEnd::kAbandoned) {
      throw std::logic_error(std::string("the run ended ") + saga::ToString(r.end) +
                             ", which the kit's journal never causes");
    }
    // Completed, failed, or stuck for good.
    out.end = r.end == saga::SagaEnd::kCompleted ? End::kCompleted
              : r.end == saga::SagaEnd::kFailed  ? End::kFailed
                                                 : End::kStuck;
    if (out.end == End::kStuck) {
      out.status = 202;
      out.body = {{"status", env.row.compensating ? "compensating" : "started"},
                  {"stuck", true},
                  {"order_id", o.order_id},
                  {"idempotency_key", o.key},
                  {"trace_id", o.trace_id}};
      for (const auto& s : r.steps) {
        if (!s.detail.empty() && s.status != saga::StepStatus::kSucceeded &&
            s.status != saga::StepStatus::kCompensated) {
          out.stuck_detail += (out.stuck_detail.empty() ? "" : "; ") + s.name + ": " + s.detail;
        }
      }
      if (out.stuck_detail.empty()) {
        // Deferred with no step to blame: the input, a condition or the answer did not compute
        // (the engine's saga_stuck log line says which).
        out.stuck_detail = "stuck before or after its steps: see the saga_stuck log line";
      }
      out.failed_step = env.row.failed_step;
    } else {
      Answer(r, o, out);
      out.answer = r.answer;
      out.failed_step = r.failed_step;
      out.failure = r.failure;
    }
    for (const auto& s : r.steps) {
      out.steps.push_back({s.name, saga::ToString(s.status), s.attempts, s.compensation_attempts,
                           s.output, s.detail});
    }
    out.outputs = r.outputs;
    out.compensated = r.compensated;
    break;
  }
  out.effects = env.participants.Effects();
  std::lock_guard lock(shared.mu);
  out.calls.assign(shared.calls.begin() + static_cast<std::ptrdiff_t>(first_call),
                   shared.calls.end());
  out.elapsed = milliseconds(shared.now_ms - started_ms);
  return out;
}

// ---- Checks ----

struct CheckAccess {
  static Shared& Of(Environment& env) { return *env.impl_->shared; }
};

namespace {

struct Built {
  std::unique_ptr<Environment> env;
  std::optional<Definition> definition;
};

Built Build(const SagaFactory& factory, const CheckOptions& options) {
  Built b;
  b.env = std::make_unique<Environment>(options.run);
  if (options.setup) options.setup(*b.env);
  b.definition = factory(b.env->participants());
  if (!b.definition) throw std::invalid_argument("the factory serves no saga here");
  return b;
}

std::string Names(const std::vector<std::string>& names) {
  return "[" + common::Join(names, ", ") + "]";
}

// How `got` differs from `want`, one line per difference.
std::vector<std::string> Compare(const Result& want, const Result& got) {
  std::vector<std::string> out;
  if (got.end != want.end) {
    out.push_back(std::string("ended ") + ToString(got.end) + " (" + got.stuck_detail +
                  "), the reference " + ToString(want.end));
  }
  if (got.status != want.status || got.body != want.body) {
    out.push_back("answered " + std::to_string(got.status) + " " + got.body.dump() +
                  ", the reference " + std::to_string(want.status) + " " + want.body.dump());
  }
  if (got.compensated != want.compensated) {
    out.push_back("compensated " + Names(got.compensated) + ", the reference " +
                  Names(want.compensated));
  }
  for (const auto& w : want.steps) {
    const StepRecord* g = got.Step(w.name);
    if (g != nullptr && g->status != w.status) {
      out.push_back("step " + w.name + " ended " + g->status + ", the reference " + w.status);
    }
  }
  std::set<std::string> keys;
  for (const auto& [k, n] : want.effects) keys.insert(k);
  for (const auto& [k, n] : got.effects) keys.insert(k);
  for (const auto& k : keys) {
    auto w = want.effects.count(k) ? want.effects.at(k) : 0;
    auto g = got.effects.count(k) ? got.effects.at(k) : 0;
    if (g > 1) out.push_back(k + " applied " + std::to_string(g) + " times");
    if ((g > 0) != (w > 0)) {
      out.push_back(k + (g > 0 ? " applied" : " not applied") + ", the reference " +
                    (w > 0 ? "applied" : "not applied"));
    }
  }
  return out;
}

}  // namespace

Result Run(const SagaFactory& factory, const nlohmann::json& input, const CheckOptions& options) {
  Built b = Build(factory, options);
  return b.env->Run(*b.definition, input);
}

CrashReport CheckCrashes(const SagaFactory& factory, const nlohmann::json& input,
                         const CheckOptions& options) {
  CrashReport report;
  std::vector<std::string> where;
  {
    Built b = Build(factory, options);
    report.reference = b.env->Run(*b.definition, input);
    Shared& s = CheckAccess::Of(*b.env);
    std::lock_guard lock(s.mu);
    where = s.where;
  }
  report.points = static_cast<int>(where.size());
  for (int k = 1; k <= report.points; ++k) {
    Built b = Build(factory, options);
    {
      Shared& s = CheckAccess::Of(*b.env);
      std::lock_guard lock(s.mu);
      s.crash_at = k;
    }
    Result got = b.env->Run(*b.definition, input);
    auto diffs = Compare(report.reference, got);
    if (!diffs.empty()) {
      report.differences.push_back({k, where[k - 1], common::Join(diffs, "; ")});
    }
  }
  return report;
}

std::vector<BodyDifference> CheckDeterministic(const SagaFactory& factory,
                                               const nlohmann::json& input,
                                               const CheckOptions& options) {
  auto first_bodies = [](const Result& r) {
    std::map<std::string, Call> out;  // derived key -> its first call
    for (const auto& c : r.calls) out.emplace(c.derived_key, c);
    return out;
  };
  auto a = first_bodies(Run(factory, input, options));
  auto b = first_bodies(Run(factory, input, options));
  std::set<std::string> keys;
  for (const auto& [k, c] : a) keys.insert(k);
  for (const auto& [k, c] : b) keys.insert(k);
  std::vector<BodyDifference> out;
  for (const auto& k : keys) {
    auto x = a.find(k);
    auto y = b.find(k);
    std::string first = x != a.end() ? x->second.path + " " + x->second.body.dump() : "";
    std::string second = y != b.end() ? y->second.path + " " + y->second.body.dump() : "";
    if (first == second) continue;
    const Call& c = x != a.end() ? x->second : y->second;
    out.push_back({c.step, c.participant, k, first, second});
  }
  return out;
}

}  // namespace idemsaga::testing
