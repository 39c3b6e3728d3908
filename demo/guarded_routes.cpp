#include "demo/guarded_routes.hpp"

#include "common/log.hpp"

namespace idemsaga::demo {
namespace {

using common::http::SetError;
using common::http::SetUnavailable;

// Closes the connection without any answer, as a crash after the commit would: the caller
// cannot tell whether the effect happened.
void DropConnection(httplib::Response& res) { common::http::CloseWithoutResponse(res); }

}  // namespace

GuardedRoutes::GuardedRoutes(std::string service, common::pg::Pool& pool, Faults& faults,
                             ParticipantOptions options, const common::trace::Tracer* tracer)
    : service_(std::move(service)),
      pool_(&pool),
      faults_(faults),
      options_(std::move(options)),
      guard_(std::make_unique<steps::guard::Guard>(pool, tracer, options_.guard)),
      http_(*guard_,
            {.service_token = options_.service_token,
             .limits = options_.limits,
             .metrics = &metrics_,
             .service = service_,
             .placement = options_.placement},
            tracer, FaultHooks()) {
  common::pg::AddMetrics(metrics_, *pool_);
}

GuardedRoutes::GuardedRoutes(std::string service, Faults& faults, ParticipantOptions options,
                             StoreHooks store, const common::trace::Tracer* tracer)
    : service_(std::move(service)),
      pool_(nullptr),
      faults_(faults),
      options_(std::move(options)),
      store_(std::move(store)),
      http_({.service_token = options_.service_token,
             .limits = options_.limits,
             .metrics = &metrics_,
             .service = service_,
             .placement = options_.placement},
            tracer, FaultHooks()) {}

steps::guard::HttpGuardHooks GuardedRoutes::FaultHooks() {
  return {.before_request = [this](const steps::guard::Request& request,
                                   httplib::Response& res) -> std::optional<std::string> {
            faults_.HoldWhileHung();
            auto retry_after_s = faults_.Fail(request.key);
            if (!retry_after_s) return std::nullopt;
            common::http::SetAnswer(
                res, common::http::UnavailableAnswer("injected fault",
                                                     std::chrono::seconds(*retry_after_s)));
            return "unavailable";
          },
          .after = [this](const steps::guard::Response&,
                          httplib::Response& res) -> std::optional<std::string> {
            faults_.DelayAnswer();
            if (!faults_.ShouldDropAfterCommit()) return std::nullopt;
            DropConnection(res);
            return "dropped";
          }};
}

bool GuardedRoutes::Authorized(const httplib::Request& req, httplib::Response& res) const {
  return http_.Authorized(req, res);
}

void GuardedRoutes::Post(common::http::Server& server, const std::string& path,
                         common::http::Server::Handler handler) {
  commands_[path] = handler;
  server.Post(path, std::move(handler));
}

void GuardedRoutes::Action(common::http::Server& server, const std::string& path,
                           steps::guard::Validate validate, steps::guard::RouteEffect effect) {
  Post(server, path, http_.Action(std::move(validate), std::move(effect)));
}

void GuardedRoutes::PlannedAction(
    common::http::Server& server, const std::string& path, steps::guard::Validate validate,
    std::function<steps::guard::PlannedEffect(const steps::guard::Request&)> plan) {
  Post(server, path, http_.PlannedAction(std::move(validate), std::move(plan)));
}

void GuardedRoutes::Compensation(common::http::Server& server, const std::string& path,
                                 steps::guard::RouteUndo undo) {
  Post(server, path, http_.Compensation(std::move(undo)));
}

void GuardedRoutes::GuardedAction(common::http::Server& server, const std::string& path,
                                  steps::guard::Validate validate,
                                  steps::guard::HttpGuard::Run run) {
  Post(server, path, http_.Guarded("action", std::move(validate), std::move(run)));
}

void GuardedRoutes::GuardedCompensation(common::http::Server& server, const std::string& path,
                                        steps::guard::HttpGuard::RunCompensation run) {
  Post(server, path, http_.GuardedCompensation(std::move(run)));
}

void GuardedRoutes::AdminRoutes(common::http::Server& server) {
  if (pool_ != nullptr) {
    common::http::AddHealthRoutes(server, [this] { return common::pg::Reachable(*pool_); });
  } else {
    server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    server.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      if (store_.ready && store_.ready()) {
        res.set_content(R"({"status":"ready"})", "application/json");
      } else {
        SetUnavailable(res, "the store is not reachable");
      }
    });
  }
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.Render(), common::metrics::kContentType);
  });
  // What an orchestrator checks at start-up: that its keys outlive every parent that may
  // still retry or compensate them.
  if (guard_) {
    server.Get(steps::protocol::kPolicyPath, http_.Policy());
    server.Get(steps::protocol::kKeysPath, http_.Keys());
  } else {
    server.Get(steps::protocol::kPolicyPath, http_.Policy(options_.guard.retention));
    if (store_.list_keys) server.Get(steps::protocol::kKeysPath, http_.Keys(store_.list_keys));
  }
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

}  // namespace idemsaga::demo
