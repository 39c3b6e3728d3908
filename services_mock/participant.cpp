#include "services_mock/participant.hpp"

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"

namespace services_mock {
namespace {

using common::http::SetError;

// Answers headers, then closes the connection before the body: the caller cannot tell whether
// the effect happened (cpp-httplib 0.11 has no way to close a socket from a handler).
void DropConnection(httplib::Response& res) {
  res.status = 500;
  res.set_content_provider(64, "application/json",
                           [](size_t, size_t, httplib::DataSink&) { return false; });
}

void Unavailable(httplib::Response& res, const std::string& why) {
  SetError(res, 503, "unavailable", why + "; retrying with the same key is safe");
  res.set_header("Retry-After", "1");
}

}  // namespace

Participant::Participant(std::string service, common::pg::Pool& pool, Faults& faults,
                         ParticipantOptions options)
    : service_(std::move(service)),
      pool_(pool),
      faults_(faults),
      options_(std::move(options)),
      guard_(pool) {}

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
      common::ParseIdempotencyKey(req.has_header("Idempotency-Key"),
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
  if (answer.status == steps::guard::kInProgressStatus && !answer.replayed) {
    res.set_header("Retry-After", "1");
  }
}

void Participant::Action(common::http::Server& server, const std::string& path, Validate validate,
                         Effect effect) {
  server.Post(path, [this, validate = std::move(validate), effect = std::move(effect)](
                        const httplib::Request& req, httplib::Response& res) {
    faults_.HoldWhileHung();
    auto admitted = Admit(req, res);
    if (!admitted) return;
    if (auto problem = validate(admitted->body); !problem.empty()) {
      SetError(res, 400, "invalid_request", problem);
      return;
    }
    if (faults_.ShouldFail()) return Unavailable(res, "injected fault");
    try {
      auto answer = guard_.Run(*admitted, [&](pqxx::work& tx) { return effect(tx, *admitted); });
      faults_.DelayAnswer();
      if (faults_.ShouldDropAfterCommit()) return DropConnection(res);
      Answer(answer, res);
    } catch (const std::exception& e) {
      common::Log("guard_transient_failure", {{"service", service_},
                                              {"tenant", admitted->tenant_id},
                                              {"key", admitted->key},
                                              {"error", e.what()}});
      Unavailable(res, "the request could not be completed");
    }
  });
}

void Participant::Compensation(common::http::Server& server, const std::string& path, Undo undo) {
  server.Post(path, [this, undo = std::move(undo)](const httplib::Request& req,
                                                   httplib::Response& res) {
    faults_.HoldWhileHung();
    auto admitted = Admit(req, res);
    if (!admitted) return;
    const auto& body = admitted->body;
    if (!body.is_object() || body.size() != 1 || !body.contains("action_key") ||
        !body["action_key"].is_string()) {
      SetError(res, 400, "invalid_request", "the body must be {\"action_key\": \"<key>\"}");
      return;
    }
    auto action_key = body["action_key"].get<std::string>();
    auto parsed = common::ParseIdempotencyKey(true, action_key, kMaxStepKeyLength);
    if (!parsed.ok() || parsed.key != action_key || action_key == admitted->key) {
      SetError(res, 400, "invalid_request",
               "action_key must be 1-255 printable characters and differ from this request's key");
      return;
    }
    if (faults_.ShouldFail()) return Unavailable(res, "injected fault");
    try {
      auto answer = guard_.Compensate(
          *admitted, action_key, [&](pqxx::work& tx, const steps::guard::ActionRecord& action) {
            return undo(tx, *admitted, action);
          });
      faults_.DelayAnswer();
      if (faults_.ShouldDropAfterCommit()) return DropConnection(res);
      Answer(answer, res);
    } catch (const std::exception& e) {
      common::Log("guard_transient_failure", {{"service", service_},
                                              {"tenant", admitted->tenant_id},
                                              {"key", admitted->key},
                                              {"error", e.what()}});
      Unavailable(res, "the compensation could not be completed");
    }
  });
}

void Participant::AdminRoutes(common::http::Server& server) {
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    try {
      pool_.With([](pqxx::connection& conn) {
        pqxx::nontransaction tx(conn);
        tx.exec("SELECT 1");
      });
      res.set_content(R"({"status":"ready"})", "application/json");
    } catch (const std::exception&) {
      Unavailable(res, "the database is not reachable");
    }
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
