// Operators' routes (a tenant's sagas, retrying a stuck one, metrics) and who a caller is.
#include "common/crypto.hpp"
#include "common/log.hpp"
#include "orchestrator/http/routes.hpp"

namespace orchestrator::http {

using common::http::SetError;

std::optional<std::string> TenantAuth::operator()(const httplib::Request& req) {
  std::string token = common::http::BearerToken(req);
  if (token.empty() || token.size() > 256) return std::nullopt;
  std::string hash = common::Sha256Hex(token);
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(hash);
    if (it != cache_.end() && it->second.second > now) return it->second.first;
  }
  // Cached so that an order costs no extra transaction for authentication.
  auto tenant = store_.TenantForKeyHash(hash);
  if (tenant) {
    std::lock_guard lock(mutex_);
    if (cache_.size() > 10000) cache_.clear();
    cache_[hash] = {*tenant, now + ttl_};
  }
  return tenant;
}

void AddAdminRoutes(common::http::Server& server, const AdminRoutes& d) {
  server.Get("/v1/sagas", [d](const httplib::Request& req, httplib::Response& res) {
    auto tenant = d.auth(req);
    if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
    std::optional<SagaStatus> status;
    if (auto name = req.get_param_value("status"); !name.empty()) {
      status = ParseSagaStatus(name);
      if (!status) {
        return SetError(res, 400, "invalid_request",
                        "status must be started, compensating, completed or failed");
      }
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
    for (const auto& row : d.store.List(*tenant, status, stuck, limit))
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

  // Prometheus text format (common::metrics); no credentials, like /health.
  server.Get("/metrics", [d](const httplib::Request&, httplib::Response& res) {
    res.set_content(d.metrics.Render(), common::metrics::kContentType);
  });
}

}  // namespace orchestrator::http
