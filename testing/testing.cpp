// The test kit (include/idemsaga/testing.hpp): the real runner over fake participants, an
// in-memory journal shaped as the orchestrator's row, and a virtual clock. Here: the
// environment (its journal, clock and runs) and a run's result; the fake participants are
// fake_participants.cpp, the checks checks.cpp, what they share world.hpp.
#include "idemsaga/testing.hpp"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <stdexcept>

#include "common/strings.hpp"
#include "steps/saga/runner.hpp"
#include "testing/world.hpp"

namespace idemsaga::testing {

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

nlohmann::json StepsJson(const std::vector<steps::saga::StepRecord>& steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : steps) out.push_back(s.ToJson());
  return out;
}

class KitJournal : public steps::saga::Journal {
 public:
  KitJournal(Shared& shared, Row& row) : shared_(shared), row_(row) {}

  bool KeepLease() override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    return true;
  }
  bool BeginCompensation(const std::vector<steps::saga::StepRecord>& steps, const StepResult& cause,
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
  bool DeferStuck(const std::vector<steps::saga::StepRecord>& steps,
                  milliseconds retry_in) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.steps = StepsJson(steps);
    row_.wake_in = retry_in;
    row_.awaiting.clear();
    return true;
  }
  ParkResult Park(const std::vector<steps::saga::StepRecord>& steps,
                  milliseconds wake_in) override {
    std::lock_guard lock(shared_.mu);
    shared_.AliveLocked();
    row_.steps = StepsJson(steps);
    row_.wake_in = wake_in;
    row_.awaiting.clear();
    return ParkResult::kParked;
  }
  std::optional<steps::saga::ReceivedEvent> Event(const std::vector<std::string>& names) override {
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
  AwaitResult AwaitEvent(const std::vector<steps::saga::StepRecord>& steps,
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

steps::saga::RetryPolicy EnginePolicy(const Policy& p) {
  steps::saga::RetryPolicy r;
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
void Answer(const steps::saga::SagaResult& r, const RunOptions& o, Result& out) {
  if (r.end == steps::saga::SagaEnd::kCompleted && r.answer) {
    out.status = r.answer->status;
    out.body = r.answer->body;
    return;
  }
  if (r.end == steps::saga::SagaEnd::kCompleted) {
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
  steps::saga::Runner runner(
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
    steps::saga::SagaInput in;
    in.tenant_id = o.tenant;
    in.parent_key = o.key;
    in.request = input;
    in.trace_id = o.trace_id;
    in.root_span_id = std::string(16, 'b');
    in.resumed = !first;
    in.typed = typed;
    // As orchestrator/saga_service.cpp (InputOf) reads the row back.
    std::vector<steps::saga::StepRecord> steps;
    for (const auto& s : env.row.steps) steps.push_back(steps::saga::StepRecord::FromJson(s));
    if (env.row.compensating) {
      in.compensating = std::move(steps);
      in.failure = env.row.failure;
      in.failed_step = env.row.failed_step;
    } else if (!steps.empty()) {
      in.checkpoint = std::move(steps);
    }
    steps::saga::SagaResult r;
    try {
      r = runner.Run(std::move(in), journal);
    } catch (const Crashed&) {
      // Killed: what the journal persisted stays, and a new owner takes the saga over.
      std::lock_guard lock(shared.mu);
      shared.crashed = false;
      shared.crash_at = 0;
      continue;
    }
    if (r.end == steps::saga::SagaEnd::kParked) {
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
    if (r.end == steps::saga::SagaEnd::kDeferred && stuck++ < o.stuck_retries) {
      std::lock_guard lock(shared.mu);
      shared.AdvanceLocked(env.row.wake_in);
      continue;
    }
    if (r.end == steps::saga::SagaEnd::kFenced || r.end == steps::saga::SagaEnd::kAbandoned) {
      throw std::logic_error(std::string("the run ended ") + steps::saga::ToString(r.end) +
                             ", which the kit's journal never causes");
    }
    // Completed, failed, or stuck for good.
    out.end = r.end == steps::saga::SagaEnd::kCompleted ? End::kCompleted
              : r.end == steps::saga::SagaEnd::kFailed  ? End::kFailed
                                                        : End::kStuck;
    if (out.end == End::kStuck) {
      out.status = 202;
      out.body = {{"status", env.row.compensating ? "compensating" : "started"},
                  {"stuck", true},
                  {"order_id", o.order_id},
                  {"idempotency_key", o.key},
                  {"trace_id", o.trace_id}};
      for (const auto& s : r.steps) {
        if (!s.detail.empty() && s.status != steps::saga::StepStatus::kSucceeded &&
            s.status != steps::saga::StepStatus::kCompensated) {
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
      out.steps.push_back({s.name, steps::saga::ToString(s.status), s.attempts,
                           s.compensation_attempts, s.output, s.detail});
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

detail::World& CheckAccess::Of(Environment& env) { return *env.impl_->shared; }

}  // namespace idemsaga::testing
