// Operators' routes (a tenant's sagas; retrying, cancelling or resolving one; metrics) and who
// a caller is. Every decision an operator makes is one audit log line: who (the tenant whose
// API key asked, and the operator it names), what, why, and how it went.
#include "common/crypto.hpp"
#include "common/log.hpp"
#include "orchestrator/http/routes.hpp"

namespace idemsaga::orchestrator::http {

using common::http::SetError;

std::optional<std::string> Tenant(TenantAuth& auth, const httplib::Request& req) {
  return auth(common::http::BearerToken(req));
}

namespace {

// The body of an operator's decision: {"<why>": "...", "operator": "..."} (operator optional:
// the tenant by default). nullopt after answering 400.
struct Decision {
  std::string operator_name;
  std::string why;
};
std::optional<Decision> ReadDecision(const httplib::Request& req, httplib::Response& res,
                                     const std::string& tenant, const char* why_field,
                                     const common::http::Limits& limits) {
  auto body = common::http::ParseJsonBody(req, res, limits);
  if (!body) return std::nullopt;
  if (!body->is_object()) {
    SetError(res, 400, "invalid_request",
             std::string("the body must be a JSON object: {\"") + why_field + "\": \"...\"}");
    return std::nullopt;
  }
  auto text = [&](const char* name, size_t max) -> std::optional<std::string> {
    auto it = body->find(name);
    if (it == body->end()) return std::string();
    if (!it->is_string() || it->get<std::string>().empty() || it->get<std::string>().size() > max) {
      return std::nullopt;
    }
    return it->get<std::string>();
  };
  std::string problem;
  for (auto it = body->begin(); it != body->end() && problem.empty(); ++it) {
    if (it.key() != why_field && it.key() != "operator") {
      problem = "unknown field '" + it.key() + "'";
    }
  }
  auto why = text(why_field, 1000);
  auto who = text("operator", 100);
  if (problem.empty() && (!why || why->empty())) {
    problem = std::string(why_field) + " must be a string of 1 to 1000 characters";
  }
  if (problem.empty() && !who) problem = "operator must be a string of 1 to 100 characters";
  if (!problem.empty()) {
    SetError(res, 400, "invalid_request", problem);
    return std::nullopt;
  }
  return Decision{who->empty() ? "tenant:" + tenant : *who, *why};
}

}  // namespace

void AddAdminRoutes(common::http::Server& server, const AdminRoutes& d) {
  server.Get("/v1/sagas", [d](const httplib::Request& req, httplib::Response& res) {
    auto tenant = Tenant(d.auth, req);
    if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
    std::optional<store::SagaStatus> status;
    if (auto name = req.get_param_value("status"); !name.empty()) {
      status = store::ParseSagaStatus(name);
      if (!status) {
        return SetError(res, 400, "invalid_request",
                        "status must be started, compensating, completed or failed");
      }
    }
    std::string saga = req.get_param_value("saga");
    if (!saga.empty() && !steps::saga::IsValidStepName(saga)) {  // saga names follow the same rule
      return SetError(res, 400, "invalid_request",
                      "saga must be a saga's name: 1 to 32 of a-z, 0-9 and _");
    }
    bool stuck = req.get_param_value("stuck") == "true";
    int limit = 50;
    if (req.has_param("limit")) {
      auto v = req.get_param_value("limit");
      if (v.empty() || v.size() > 3 || v.find_first_not_of("0123456789") != std::string::npos ||
          std::stoi(v) < 1 || std::stoi(v) > 500) {
        return SetError(res, 400, "invalid_request", "limit must be an integer from 1 to 500");
      }
      limit = std::stoi(v);
    }
    nlohmann::json sagas = nlohmann::json::array();
    for (const auto& row : d.store.List(*tenant, status, stuck, limit, saga))
      sagas.push_back(SagaView(row));
    res.set_content(nlohmann::json{{"sagas", sagas}}.dump(), "application/json");
  });

  server.Post(R"(/v1/sagas/(.+)/retry)", [d](const httplib::Request& req, httplib::Response& res) {
    auto row = PathSaga(req, res, d.auth, d.store);
    if (!row) return;
    if (!d.store.RetryNow(row->tenant_id, row->key)) {
      return SetError(res, 409, "not_retryable",
                      "only a running saga that is stuck can be retried; this one is " +
                          std::string(ToString(row->status)) + (row->stuck ? "" : ", not stuck"));
    }
    int taken = d.recovery.SweepOnce();
    common::Log("saga_retry_requested", {{"tenant", row->tenant_id},
                                         {"key", row->key},
                                         {"taken_over_here", std::to_string(taken)}});
    res.status = 202;
    res.set_content(nlohmann::json{{"retrying", true}, {"idempotency_key", row->key}}.dump(),
                    "application/json");
  });

  server.Post(R"(/v1/sagas/(.+)/cancel)", [d](const httplib::Request& req, httplib::Response& res) {
    auto row = PathSaga(req, res, d.auth, d.store);
    if (!row) return;
    auto decision = ReadDecision(req, res, row->tenant_id, "reason", d.limits);
    if (!decision) return;
    auto result = d.sagas.Cancel(*row, decision->operator_name, decision->why);
    const char* outcome = result == SagaService::CancelResult::kRequested ? "requested"
                          : result == SagaService::CancelResult::kAlreadyCompensating
                              ? "already_compensating"
                              : "ended";
    common::Log("saga_cancel_requested", {{"tenant", row->tenant_id},
                                          {"key", row->key},
                                          {"operator", decision->operator_name},
                                          {"reason", decision->why},
                                          {"outcome", outcome},
                                          {"trace_id", row->trace_id}});
    if (result == SagaService::CancelResult::kEnded) {
      auto now = d.store.Get(row->tenant_id, row->key).value_or(*row);
      return SetError(res, 409, "not_cancellable",
                      "this saga has ended (" + std::string(ToString(now.status)) +
                          "); its stored answer stands");
    }
    res.status = 202;
    res.set_content(nlohmann::json{{"cancelling", true},
                                   {"outcome", outcome},
                                   {"takes_effect",
                                    "at the saga's next step boundary; if its last step is "
                                    "already running it completes, and status_path then shows "
                                    "cancel_requested.outcome \"too_late\""},
                                   {"idempotency_key", row->key},
                                   {"status_path", StatusPath(row->saga_name, row->key)}}
                        .dump(),
                    "application/json");
  });

  server.Post(
      R"(/v1/sagas/(.+)/resolve)", [d](const httplib::Request& req, httplib::Response& res) {
        auto row = PathSaga(req, res, d.auth, d.store);
        if (!row) return;
        auto decision = ReadDecision(req, res, row->tenant_id, "note", d.limits);
        if (!decision) return;
        auto step = d.sagas.Resolve(*row, decision->operator_name, decision->why);
        common::Log("saga_resolved", {{"tenant", row->tenant_id},
                                      {"key", row->key},
                                      {"operator", decision->operator_name},
                                      {"note", decision->why},
                                      {"step", step.value_or("")},
                                      {"outcome", step ? "resolved" : "refused"},
                                      {"trace_id", row->trace_id}});
        if (!step) {
          return SetError(res, 409, "not_resolvable",
                          "only a compensation that is stuck can be resolved; this saga is " +
                              std::string(ToString(row->status)) +
                              (row->stuck ? "" : ", not stuck (or recovery is retrying it now)"));
        }
        // The steps before it are compensated by the saga itself, from here at once.
        d.recovery.SweepOnce();
        res.status = 202;
        res.set_content(nlohmann::json{{"resolved", true},
                                       {"step", *step},
                                       {"idempotency_key", row->key},
                                       {"status_path", StatusPath(row->saga_name, row->key)}}
                            .dump(),
                        "application/json");
      });

  // Prometheus text format (common::metrics); no credentials, like /health.
  server.Get("/metrics", [d](const httplib::Request&, httplib::Response& res) {
    res.set_content(d.metrics.Render(), common::metrics::kContentType);
  });
}

}  // namespace idemsaga::orchestrator::http
