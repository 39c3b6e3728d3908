#include "steps/guard/http_guard.hpp"

#include <cctype>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/trace/span_status.hpp"
#include "common/trace/trace_context.hpp"

namespace idemsaga::steps::guard {

using common::http::SetError;

HttpGuard::HttpGuard(Guard& guard, HttpGuardOptions options, const common::trace::Tracer* tracer,
                     HttpGuardHooks hooks)
    : HttpGuard(static_cast<KeyStore&>(guard), std::move(options), tracer, std::move(hooks)) {
  guard_ = &guard;
}

HttpGuard::HttpGuard(KeyStore& store, HttpGuardOptions options, const common::trace::Tracer* tracer,
                     HttpGuardHooks hooks)
    : HttpGuard(std::move(options), tracer, std::move(hooks)) {
  store_ = &store;
}

HttpGuard::HttpGuard(HttpGuardOptions options, const common::trace::Tracer* tracer,
                     HttpGuardHooks hooks)
    : guard_(nullptr), options_(std::move(options)), tracer_(tracer), hooks_(std::move(hooks)) {
  if (options_.metrics != nullptr) {
    requests_ = &options_.metrics->Counter(
        "idemsaga_guard_requests_total",
        "Guarded requests by service, kind (action or compensation) and what the guard did.",
        {"service", "kind", "outcome"});
    for (protocol::Outcome outcome : {protocol::Outcome::kApplied, protocol::Outcome::kReplayed,
                                      protocol::Outcome::kReused, protocol::Outcome::kInProgress}) {
      requests_->With({options_.service, "action", protocol::MetricLabel(outcome)});
    }
    requests_->With(
        {options_.service, "compensation", protocol::MetricLabel(protocol::Outcome::kUndone)});
  }
}

void HttpGuard::Count(const char* kind, const std::string& outcome) const {
  if (requests_ == nullptr) return;
  requests_->With({options_.service, kind, outcome}).Inc();
}

bool HttpGuard::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (common::ConstantTimeEquals(common::http::BearerToken(req), options_.service_token)) {
    return true;
  }
  SetError(res, 401, "unauthorized", "a valid service token is required");
  res.set_header("WWW-Authenticate", "Bearer");
  return false;
}

std::optional<Request> HttpGuard::Admit(const httplib::Request& req, httplib::Response& res) const {
  if (!Authorized(req, res)) return std::nullopt;
  auto tenant = req.get_header_value("X-Tenant-ID");
  if (!common::IsValidTenantId(tenant)) {
    SetError(res, 401, "unauthorized", "X-Tenant-ID must be 1-64 of [A-Za-z0-9_-]");
    return std::nullopt;
  }
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxStepKeyLength);
  if (!key.ok()) {
    SetError(res, 400, key.error, key.message);
    return std::nullopt;
  }
  auto body = common::http::ParseJsonBody(req, res, options_.limits);
  if (!body) return std::nullopt;
  return Request{tenant, key.key, req.method, req.path, std::move(*body)};
}

namespace {

// Headers the server frames the answer with: never taken from a stored answer.
bool IsFramingHeader(const std::string& name) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "content-type" || lower == "content-length" || lower == "transfer-encoding" ||
         lower == "connection" || lower == "idempotent-replayed";
}

}  // namespace

void WriteAnswer(const Response& answer, httplib::Response& res) {
  res.status = answer.status;
  res.set_content(answer.body, answer.content_type.c_str());
  for (const auto& [name, value] : answer.headers) {
    if (!IsFramingHeader(name)) res.set_header(name.c_str(), value);
  }
  if (answer.replayed) res.set_header("Idempotent-Replayed", "true");
  // Retry-After, when the guard asks the caller to come back, is one of `answer.headers`
  // (Refuse).
}

void HttpGuard::Serve(const char* kind, const httplib::Request& req, httplib::Response& res,
                      const std::function<std::string(const Request&)>& validate,
                      const std::function<Response(const Request&)>& run) const {
  common::trace::Span span;
  if (tracer_ != nullptr) {
    auto caller = common::trace::ParseTraceparent(req.get_header_value("traceparent"));
    common::trace::SpanContext parent;
    if (caller) parent = {caller->trace_id, caller->parent_id};
    span = tracer_->Start(req.method + " " + req.path, parent, common::trace::SpanKind::kServer);
  }
  // Whether `res` is the answer the effect stored (now or replayed): a business refusal there
  // is the participant working correctly (common/trace/span_status.hpp).
  bool stored_outcome = false;
  auto finish = [&] { common::trace::EndRequestSpan(span, res.status, stored_outcome); };
  auto admitted = Admit(req, res);
  if (!admitted) {
    Count(kind, "refused");
    return finish();
  }
  admitted->trace = span.context();
  span.Set("tenant", admitted->tenant_id).Set("idempotency_key", admitted->key);
  if (options_.placement != nullptr) {
    try {
      options_.placement->Require(admitted->tenant_id, common::pg::Placement::Role::kParticipant);
    } catch (const common::Misplaced& refusal) {
      common::http::SetAnswer(res, common::http::MisplacedAnswer(refusal));
      Count(kind, "misplaced");
      return finish();
    }
  }
  if (auto problem = validate(*admitted); !problem.empty()) {
    SetError(res, 400, "invalid_request", problem);
    Count(kind, "refused");
    return finish();
  }
  std::optional<std::string> answered;
  if (hooks_.before) answered = hooks_.before(res);
  if (!answered && hooks_.before_request) answered = hooks_.before_request(*admitted, res);
  if (answered) {
    Count(kind, *answered);
    return finish();
  }
  try {
    auto answer = run(*admitted);
    span.Set("guard.outcome", std::string(protocol::ToString(answer.outcome)))
        .Set("replayed", answer.replayed);
    Count(kind, protocol::MetricLabel(answer.outcome));
    if (hooks_.after) {
      if (auto answered = hooks_.after(answer, res)) {
        Count(kind, *answered);
        return finish();
      }
    }
    WriteAnswer(answer, res);
    stored_outcome = answer.outcome == protocol::Outcome::kApplied ||
                     answer.outcome == protocol::Outcome::kReplayed;
  } catch (...) {
    // Nothing was stored (the guard's transaction rolled back), or, when the COMMIT got no
    // answer (in_doubt_error, a failover), perhaps it was: a retry with the key then replays
    // it, so an outage answers 503 either way, never a failure. Only an outage invites a
    // retry; a value the store refused fails the same way every time.
    auto failure = common::http::SetFailure(res, std::current_exception(), common::pg::Classify);
    bool outage = failure.kind == common::pg::Failure::kUnavailable;
    common::Log(outage ? "guard_transient_failure" : "guard_failure",
                {{"path", req.path},
                 {"tenant", admitted->tenant_id},
                 {"key", admitted->key},
                 {"sqlstate", failure.sqlstate},
                 {"error", failure.what}});
    Count(kind, outage ? "unavailable" : "internal_error");
  }
  finish();
}

namespace {

std::string ValidateCompensation(const Request& r) {
  const auto& body = r.body;
  bool flag = body.is_object() && body.contains("action_applied");
  if (!body.is_object() || body.size() != (flag ? 2u : 1u) || !body.contains("action_key") ||
      !body["action_key"].is_string() || (flag && !body["action_applied"].is_boolean())) {
    return "the body must be {\"action_key\": \"<key>\"} with an optional "
           "\"action_applied\": true|false";
  }
  auto action_key = body["action_key"].get<std::string>();
  if (!common::IsValidKeyBytes(action_key, kMaxStepKeyLength) || action_key == r.key) {
    return "action_key must be 1-255 printable characters and differ from this request's key";
  }
  return "";
}

}  // namespace

// The entry points over the PostgreSQL Guard are the store-neutral ones with Guard's calls.
HttpGuard::Handler HttpGuard::Action(Validate validate, RouteEffect effect,
                                     EffectScope scope) const {
  return Guarded("action", std::move(validate),
                 [this, effect = std::move(effect), scope](const Request& r) {
                   return guard_->Run(
                       r, [&](pqxx::work& tx) { return effect(tx, r); }, scope);
                 });
}

HttpGuard::Handler HttpGuard::PlannedAction(
    Validate validate, std::function<PlannedEffect(const Request& req)> plan) const {
  return Guarded("action", std::move(validate), [this, plan = std::move(plan)](const Request& r) {
    return guard_->RunPlanned(r, plan(r));
  });
}

HttpGuard::Handler HttpGuard::Compensation(RouteUndo undo) const {
  return GuardedCompensation([this, undo = std::move(undo)](const Request& r,
                                                            const std::string& action_key,
                                                            bool action_applied) {
    return guard_->Compensate(
        r, action_key,
        [&](pqxx::work& tx, const ActionRecord& action) { return undo(tx, r, action); },
        action_applied);
  });
}

HttpGuard::Handler HttpGuard::ExternalAction(Validate validate, ExternalEffect effect) const {
  return Guarded("action", std::move(validate),
                 [this, effect = std::move(effect)](const Request& r) {
                   return store_->RunExternal(r, effect);
                 });
}

HttpGuard::Handler HttpGuard::ExternalCompensation(ExternalUndo undo) const {
  return GuardedCompensation([this, undo = std::move(undo)](const Request& r,
                                                            const std::string& action_key,
                                                            bool action_applied) {
    return store_->CompensateExternal(r, action_key, undo, action_applied);
  });
}

HttpGuard::Handler HttpGuard::Guarded(const char* kind, Validate validate, Run run) const {
  return [this, kind, validate = std::move(validate), run = std::move(run)](
             const httplib::Request& req, httplib::Response& res) {
    Serve(
        kind, req, res,
        [&](const Request& r) { return validate ? validate(r.body) : std::string(); }, run);
  };
}

HttpGuard::Handler HttpGuard::GuardedCompensation(RunCompensation run) const {
  return [this, run = std::move(run)](const httplib::Request& req, httplib::Response& res) {
    Serve("compensation", req, res, ValidateCompensation, [&](const Request& r) {
      return run(r, r.body["action_key"].get<std::string>(), r.body.value("action_applied", false));
    });
  };
}

HttpGuard::Handler HttpGuard::Keys() const {
  return Keys([this](const std::string& tenant_id, std::chrono::seconds since,
                     const std::string& after,
                     int limit) { return store_->ListKeys(tenant_id, since, after, limit); });
}

HttpGuard::Handler HttpGuard::Keys(ListKeys list) const {
  return [this, list = std::move(list)](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    auto number = [&](const char* name, long long lo, long long hi,
                      long long fallback) -> std::optional<long long> {
      if (!req.has_param(name)) return fallback;
      auto v = req.get_param_value(name);
      if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) {
        return std::nullopt;
      }
      long long n = std::stoll(v);
      return n < lo || n > hi ? std::nullopt : std::optional<long long>(n);
    };
    auto tenant = req.get_param_value("tenant");
    auto since = number("since_seconds", 1, 10LL * 365 * 86400, -1);
    auto limit = number("limit", 1, 1000, 500);
    auto after = req.get_param_value("after");
    if (!common::IsValidTenantId(tenant) || !since || *since < 0 || !limit ||
        after.size() > kMaxStepKeyLength) {
      return SetError(res, 400, "invalid_request",
                      "tenant (a tenant id), since_seconds (1 or more) and optionally after (a "
                      "key) and limit (1-1000) are required");
    }
    auto keys = list(tenant, std::chrono::seconds(*since), after, static_cast<int>(*limit));
    nlohmann::json listed = nlohmann::json::array();
    for (const auto& k : keys) listed.push_back(k.ToJson());
    nlohmann::json next = nullptr;
    if (static_cast<long long>(keys.size()) == *limit) next = keys.back().key;
    res.set_content(nlohmann::json{{"keys", listed}, {"next", next}}.dump(), "application/json");
  };
}

HttpGuard::Handler HttpGuard::Policy() const { return Policy(store_->options().retention); }

HttpGuard::Handler HttpGuard::Policy(std::chrono::seconds retention) const {
  return [this, retention](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    nlohmann::json policy = {{"key_retention_seconds", retention.count()}};
    res.set_content(policy.dump(), "application/json");
  };
}

}  // namespace idemsaga::steps::guard
