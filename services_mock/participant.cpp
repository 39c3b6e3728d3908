#include "services_mock/participant.hpp"

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/trace/trace_context.hpp"

namespace services_mock {
namespace {

using common::http::SetError;

// Closes the connection without any answer, as a crash after the commit would: the caller
// cannot tell whether the effect happened.
void DropConnection(httplib::Response& res) { common::http::CloseWithoutResponse(res); }

}  // namespace

Participant::Participant(std::string service, common::pg::Pool& pool, Faults& faults,
                         ParticipantOptions options, const common::trace::Tracer* tracer)
    : service_(std::move(service)),
      pool_(pool),
      faults_(faults),
      options_(std::move(options)),
      tracer_(tracer),
      guard_(pool, tracer, options_.guard) {
  for (const char* outcome :
       {"applied", "replayed", "mismatch", "cancelled", "compensated", "in_progress",
        "action_unknown", "refused", "unavailable", "dropped"}) {
    outcomes_[outcome] = 0;
  }
}

void Participant::Count(const std::string& outcome) {
  if (auto it = outcomes_.find(outcome); it != outcomes_.end()) ++it->second;
}

std::string Participant::MetricsText() const {
  std::string out =
      "# HELP idemsaga_guard_requests_total Guarded requests by what the idempotency guard "
      "did.\n# TYPE idemsaga_guard_requests_total counter\n";
  for (const auto& [outcome, n] : outcomes_) {
    out += "idemsaga_guard_requests_total{service=\"" + service_ + "\",outcome=\"" + outcome +
           "\"} " + std::to_string(n.load()) + "\n";
  }
  return out;
}

common::trace::Span Participant::StartRequestSpan(const httplib::Request& req) const {
  if (tracer_ == nullptr) return {};
  auto caller = common::trace::ParseTraceparent(req.get_header_value("traceparent"));
  common::trace::SpanContext parent;
  if (caller) parent = {caller->trace_id, caller->parent_id};
  return tracer_->Start(req.method + " " + req.path, parent, common::trace::SpanKind::kServer);
}

void Participant::Guarded(
    const httplib::Request& req, httplib::Response& res,
    const std::function<std::string(const steps::guard::Request&)>& validate,
    const std::function<steps::guard::Response(const steps::guard::Request&)>& run) {
  faults_.HoldWhileHung();
  auto span = StartRequestSpan(req);
  auto admitted = Admit(req, res);
  if (admitted) {
    admitted->trace = span.context();
    span.Set("tenant", admitted->tenant_id).Set("idempotency_key", admitted->key);
    if (auto problem = validate(*admitted); !problem.empty()) {
      SetError(res, 400, "invalid_request", problem);
      Count("refused");
    } else if (faults_.ShouldFail()) {
      common::http::SetUnavailable(res, "injected fault");
      span.Set("fault", std::string("error"));
      Count("unavailable");
    } else {
      try {
        auto answer = run(*admitted);
        span.Set("guard.outcome", answer.outcome).Set("replayed", answer.replayed);
        Count(answer.outcome);
        faults_.DelayAnswer();
        if (faults_.ShouldDropAfterCommit()) {
          span.Set("fault", std::string("drop_after_commit")).Error("connection dropped");
          Count("dropped");
          return DropConnection(res);
        }
        Answer(answer, res);
      } catch (const std::exception& e) {
        common::Log("guard_transient_failure", {{"service", service_},
                                                {"tenant", admitted->tenant_id},
                                                {"key", admitted->key},
                                                {"error", e.what()}});
        common::http::SetUnavailable(res, "the request could not be completed");
        Count("unavailable");
      }
    }
  } else {
    Count("refused");
  }
  span.Set("http.status_code", static_cast<long long>(res.status));
  // A stored business refusal is the participant working correctly, not a span error.
  if (res.status >= 500 || res.status == 401 || res.status == 400) {
    span.Error("HTTP " + std::to_string(res.status));
  } else {
    span.Ok();
  }
}

bool Participant::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (common::ConstantTimeEquals(common::http::BearerToken(req), options_.service_token)) {
    return true;
  }
  SetError(res, 401, "unauthorized", "a valid service token is required");
  res.set_header("WWW-Authenticate", "Bearer");
  return false;
}

std::optional<steps::guard::Request> Participant::Admit(const httplib::Request& req,
                                                        httplib::Response& res) const {
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
  return steps::guard::Request{tenant, key.key, req.method, req.path, std::move(*body)};
}

void Participant::Answer(const steps::guard::Response& answer, httplib::Response& res) {
  res.status = answer.status;
  res.set_content(answer.body, answer.content_type.c_str());
  if (answer.replayed) res.set_header("Idempotent-Replayed", "true");
  if (answer.outcome == "in_progress") res.set_header("Retry-After", "1");
}

void Participant::Action(common::http::Server& server, const std::string& path, Validate validate,
                         Effect effect) {
  server.Post(path, [this, validate = std::move(validate), effect = std::move(effect)](
                        const httplib::Request& req, httplib::Response& res) {
    Guarded(
        req, res, [&](const steps::guard::Request& r) { return validate(r.body); },
        [&](const steps::guard::Request& r) {
          return guard_.Run(
              r, [&](pqxx::work& tx) { return effect(tx, r); },
              steps::guard::EffectScope::kTransactionOnly);
        });
  });
}

void Participant::Compensation(common::http::Server& server, const std::string& path, Undo undo) {
  server.Post(
      path, [this, undo = std::move(undo)](const httplib::Request& req, httplib::Response& res) {
        Guarded(
            req, res,
            [](const steps::guard::Request& r) -> std::string {
              const auto& body = r.body;
              bool flag = body.is_object() && body.contains("action_applied");
              if (!body.is_object() || body.size() != (flag ? 2u : 1u) ||
                  !body.contains("action_key") || !body["action_key"].is_string() ||
                  (flag && !body["action_applied"].is_boolean())) {
                return "the body must be {\"action_key\": \"<key>\"} with an optional "
                       "\"action_applied\": true|false";
              }
              auto action_key = body["action_key"].get<std::string>();
              if (!common::IsValidKeyBytes(action_key, kMaxStepKeyLength) || action_key == r.key) {
                return "action_key must be 1-255 printable characters and differ from this "
                       "request's key";
              }
              return "";
            },
            [&](const steps::guard::Request& r) {
              auto action_key = r.body["action_key"].get<std::string>();
              return guard_.Compensate(
                  r, action_key,
                  [&](pqxx::work& tx, const steps::guard::ActionRecord& action) {
                    return undo(tx, r, action);
                  },
                  r.body.value("action_applied", false));
            });
      });
}

void Participant::AdminRoutes(common::http::Server& server) {
  common::http::AddHealthRoutes(server, pool_);
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  });
  // What an orchestrator checks at start-up: that its keys outlive every parent that may
  // still retry or compensate them.
  server.Get(
      steps::guard::kPolicyPath, [this](const httplib::Request& req, httplib::Response& res) {
        if (!Authorized(req, res)) return;
        nlohmann::json policy = {{"key_retention_seconds", guard_.options().retention.count()}};
        res.set_content(policy.dump(), "application/json");
      });
  server.Get("/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    res.set_content(ToJson(faults_.Get()).dump(), "application/json");
  });
  server.Put("/admin/faults", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    auto body = common::http::ParseJsonBody(req, res, options_.limits);
    if (!body) return;
    std::string error;
    auto settings = ParseFaultSettings(*body, error);
    if (!settings) {
      SetError(res, 400, "invalid_request", error);
      return;
    }
    faults_.Set(*settings);
    common::Log("faults_set", {{"service", service_}, {"faults", ToJson(*settings).dump()}});
    res.set_content(ToJson(*settings).dump(), "application/json");
  });
}

}  // namespace services_mock
