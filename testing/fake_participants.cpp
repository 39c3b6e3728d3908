// The test kit's scripted participants (include/idemsaga/testing.hpp): replies by derived key,
// guarded (a key applies once and replays its answer) unless told otherwise, each call recorded
// in the environment's world, where a crash may strike before or after it applies.
#include <map>
#include <optional>

#include "testing/world.hpp"

namespace idemsaga::testing {

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

}  // namespace idemsaga::testing
