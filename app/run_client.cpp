#include "app/run_client.hpp"

#include <mutex>
#include <thread>

#include "app/app.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/errors.hpp"

namespace idemsaga {

struct RunHandle::State {
  std::string key;
  mutable std::mutex mutex;
  std::condition_variable changed;
  RunResult result;      // kRunning until the first answer
  bool settled = false;  // nothing more will change `result`
};

namespace app {
namespace {

using State = RunResult::State;

RunResult Unavailable(std::string detail) {
  RunResult r;
  r.state = State::kUnavailable;
  r.detail = std::move(detail);
  return r;
}

RunResult Answered(int status, std::string body, bool replayed, std::string trace_id) {
  RunResult r;
  r.state = status < 400 ? State::kCompleted : State::kFailed;
  r.status = status;
  r.output = nlohmann::json::parse(body, nullptr, false);
  r.body = std::move(body);
  r.replayed = replayed;
  r.trace_id = std::move(trace_id);
  return r;
}

// The use case's outcome, for the team's code.
RunResult FromOutcome(const orchestrator::RunOutcome& o) {
  using Kind = orchestrator::RunOutcome::Kind;
  RunResult r;
  switch (o.kind) {
    case Kind::kFinished:
    case Kind::kReplayed:
      return Answered(o.answer.status, o.answer.body, o.kind == Kind::kReplayed, o.trace_id);
    case Kind::kRunning:
    case Kind::kInProgress:
      r.state = State::kRunning;
      break;
    case Kind::kReused:
      r.state = State::kReused;
      r.detail = "this idempotency key was used with a different input";
      break;
    case Kind::kInvalid:
    case Kind::kUnknownSaga:
      r.state = State::kInvalid;
      r.detail = o.kind == Kind::kInvalid ? o.detail : "no saga of this name is served here";
      break;
    case Kind::kUnavailable:
    case Kind::kInternal:
      r.state = State::kUnavailable;
      r.detail = o.detail;
      break;
  }
  r.trace_id = o.trace_id;
  return r;
}

// A failure of the store: an outage is worth another Start with the key; anything else (a
// tenant that does not exist) is not.
RunResult FromFailure(const std::exception_ptr& e) {
  auto failure = common::pg::Classify(e);
  RunResult r = Unavailable(failure.what);
  if (failure.kind != common::pg::Failure::kUnavailable) r.state = State::kInvalid;
  return r;
}

void Publish(RunHandle::State& s, RunResult r, bool settled) {
  {
    std::lock_guard lock(s.mutex);
    s.result = std::move(r);
    s.settled = settled;
  }
  s.changed.notify_all();
}

// Starts the run, then reads its row until it ends. Holds the handle's state weakly: once
// every handle is gone, nobody is waiting, and the thread ends.
void Drive(std::shared_ptr<Serving> serving, std::weak_ptr<RunHandle::State> weak,
           orchestrator::RunRequest request) {
  RunResult first = Unavailable("the orchestrator is not serving (yet): nothing was started");
  bool owns = false;
  serving->With([&](orchestrator::Orchestrator& o) {
    try {
      auto outcome = o.runs().Start(request);
      owns = outcome.Owns();
      first = FromOutcome(outcome);
    } catch (...) {
      first = FromFailure(std::current_exception());
    }
  });
  bool running = first.state == State::kRunning;
  std::string trace_id = first.trace_id;
  if (auto s = weak.lock()) {
    Publish(*s, std::move(first), !running);
  } else {
    return;
  }
  // Ended elsewhere (this process on its pool, recovery, another replica): its row says.
  auto pause = std::chrono::milliseconds(50);
  while (running) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    auto s = weak.lock();
    if (!s) return;
    std::optional<RunResult> now;
    bool serving_now = serving->With([&](orchestrator::Orchestrator& o) {
      try {
        auto row = o.store().Get(request.tenant_id, request.key);
        if (row && (row->status == orchestrator::store::SagaStatus::kCompleted ||
                    row->status == orchestrator::store::SagaStatus::kFailed)) {
          now = Answered(row->response_status, row->response_body, !owns, trace_id);
        }
      } catch (...) {  // an outage: ask again later
      }
    });
    if (!serving_now) {
      now = Unavailable("the orchestrator stopped before the run ended; it resumes on restart");
    }
    if (now) {
      running = false;
      Publish(*s, std::move(*now), true);
    }
  }
}

}  // namespace

void Serving::Set(orchestrator::Orchestrator* o) {
  {
    std::unique_lock lock(mutex_);
    orchestrator_ = o;
  }
  published_.notify_all();
}

bool Serving::WaitUntilSet(std::chrono::milliseconds timeout) {
  std::shared_lock lock(mutex_);
  return published_.wait_for(lock, timeout, [this] { return orchestrator_ != nullptr; });
}

std::shared_ptr<RunHandle::State> StartRun(std::shared_ptr<Serving> serving,
                                           const std::string& saga, const std::string& tenant,
                                           const std::string& key, nlohmann::json input) {
  auto state = std::make_shared<RunHandle::State>();
  state->key = key;
  state->result.state = State::kRunning;
  if (!common::IsValidTenantId(tenant)) {
    RunResult r;
    r.state = State::kInvalid;
    r.detail = "a tenant id is 1-64 of [A-Za-z0-9_-]";
    Publish(*state, std::move(r), true);
  } else {
    orchestrator::RunRequest request{
        .saga = saga, .tenant_id = tenant, .key = key, .input = std::move(input)};
    std::thread(Drive, std::move(serving), std::weak_ptr(state), std::move(request)).detach();
  }
  return state;
}

}  // namespace app

RunResult RunHandle::Poll() const {
  if (!state_) return app::Unavailable("no run");
  std::lock_guard lock(state_->mutex);
  return state_->result;
}

RunResult RunHandle::Wait(std::chrono::milliseconds timeout) const {
  if (!state_) return app::Unavailable("no run");
  std::unique_lock lock(state_->mutex);
  state_->changed.wait_for(lock, timeout, [this] { return state_->settled; });
  return state_->result;
}

const std::string& RunHandle::key() const {
  static const std::string kNone;
  return state_ ? state_->key : kNone;
}

RunHandle App::Start(const std::string& saga, const std::string& tenant, const std::string& key,
                     nlohmann::json input) {
  RunHandle handle;
  handle.state_ = app::StartRun(impl_->serving, saga, tenant, key, std::move(input));
  return handle;
}

bool App::WaitUntilServing(std::chrono::milliseconds timeout) {
  return impl_->serving->WaitUntilSet(timeout);
}

}  // namespace idemsaga
