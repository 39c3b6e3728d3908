// The runs API: POST /v1/orders and /v1/runs/{saga} start a saga under an Idempotency-Key;
// GET reads one.
#include "common/idempotency_key.hpp"
#include "orchestrator/http/routes.hpp"

namespace idemsaga::orchestrator::http {
namespace {

using common::http::SetAnswer;
using common::http::SetError;

RunRequest ReadRun(const httplib::Request& req, const std::string& saga, const std::string& tenant,
                   const std::string& key, nlohmann::json input, bool as_order) {
  return {.saga = saga,
          .tenant_id = tenant,
          .key = key,
          .input = std::move(input),
          .traceparent = req.get_header_value("traceparent"),
          .as_order = as_order,
          .span_name = "POST " + (as_order ? std::string("/v1/orders") : "/v1/runs/" + saga)};
}

// Starts `saga` for the request (as an order for POST /v1/orders): the caller, key and JSON
// off the wire, the rest the use case's.
void StartRun(const RunRoutes& d, const httplib::Request& req, httplib::Response& res,
              const common::http::EarlyAnswer& early, const std::string& saga, bool as_order) {
  auto tenant = Tenant(d.auth, req);
  if (!tenant) {
    SetAnswer(res, UnauthorizedRunAnswer());
    return;
  }
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) {
    SetError(res, 400, key.error, key.message);
    return;
  }
  auto body = common::http::ParseJsonBody(req, res, d.limits);
  if (!body) return;
  RunRequest run = ReadRun(req, saga, *tenant, key.key, std::move(*body), as_order);
  if (early) {
    // The saga's 202 when it outlives the response budget, or its answer after that.
    run.answer_early = [early, saga, key = key.key](const RunOutcome& o) {
      httplib::Response r;
      SetAnswer(r, RunAnswer(o, saga, key));
      return early.Send(std::move(r));
    };
  }
  RunOutcome outcome = d.runs.Start(run);
  if (outcome.deferred) {
    // The saga's answer follows through `early`.
    res.status = 202;
    common::http::DeferAnswer(res);
    return;
  }
  SetAnswer(res, RunAnswer(outcome, saga, key.key));
}

// The saga /v1/runs/{saga} names (its latest version); nullptr for none served.
const steps::saga::Definition* RunsPathSaga(const RunRoutes& d, std::string_view path) {
  constexpr std::string_view kRuns = "/v1/runs/";
  if (path.substr(0, kRuns.size()) != kRuns) return nullptr;
  return d.registry.Latest(path.substr(kRuns.size()));
}

// Starts the saga the path names (POST /v1/orders: place_order; POST /v1/runs/{saga}: its
// latest version), or refuses: who asks first, which sagas are served next.
void StartRunAt(const RunRoutes& d, const httplib::Request& req, httplib::Response& res,
                const common::http::EarlyAnswer& early) {
  if (req.path == "/v1/orders" && d.registry.Latest(kOrderSaga) != nullptr) {
    return StartRun(d, req, res, early, kOrderSaga, true);
  }
  // Who asks first: which sagas are served is not for anyone without a key.
  if (!Tenant(d.auth, req)) {
    SetAnswer(res, UnauthorizedRunAnswer());
    return;
  }
  const steps::saga::Definition* definition = RunsPathSaga(d, req.path);
  if (definition == nullptr) {
    RunOutcome unknown;
    unknown.kind = RunOutcome::Kind::kUnknownSaga;
    SetAnswer(res, RunAnswer(unknown, "", ""));
    return;
  }
  return StartRun(d, req, res, early, definition->name(), false);
}

// What became of an operator's cancel: "pending" (no step boundary reached yet),
// "compensating" (the saga is being undone), "took_effect" (it ended undone for the cancel:
// 409 saga_cancelled), "too_late" (its last step had begun: it completed, and its answer
// stands), or "overtaken" (it failed for its own reason first).
const char* CancelOutcome(const store::SagaRow& row) {
  switch (row.status) {
    case store::SagaStatus::kStarted:
      return "pending";
    case store::SagaStatus::kCompensating:
      return "compensating";
    case store::SagaStatus::kCompleted:
      return "too_late";
    case store::SagaStatus::kFailed:
      break;
  }
  auto [code, detail] =
      common::http::ErrorOf(nlohmann::json::parse(row.response_body, nullptr, false));
  return code == "saga_cancelled" ? "took_effect" : "overtaken";
}

}  // namespace

nlohmann::json SagaView(const store::SagaRow& row) {
  nlohmann::json steps = nlohmann::json::array();
  // What an operator reads first: the compensation that is stuck, else the step that failed,
  // else the latest step that recorded an error (a retried attempt, say).
  nlohmann::json last_error;
  int last_error_rank = 0;
  for (size_t i = 0; i < row.steps.size(); ++i) {
    if (auto unreadable = row.unreadable_steps.find(i); unreadable != row.unreadable_steps.end()) {
      steps.push_back({{"unreadable", unreadable->second.stored}});  // shown as it is
      continue;
    }
    const steps::saga::StepRecord& s = row.steps[i];
    nlohmann::json step = {{"name", s.name},
                           {"derived_key", s.action_key},
                           {"status", steps::saga::ToString(s.status)},
                           {"attempts", s.attempts},
                           {"compensation_attempts", s.compensation_attempts},
                           {"replayed", s.replayed}};
    if (!s.detail.empty()) {
      step["detail"] = s.detail;
      bool compensating = s.status == steps::saga::StepStatus::kCompensating;
      int rank = compensating ? 3 : s.name == row.failed_step ? 2 : 1;
      if (rank >= last_error_rank) {
        last_error_rank = rank;
        last_error = {{"step", s.name},
                      {"detail", s.detail},
                      {"attempts", compensating ? s.compensation_attempts : s.attempts},
                      {"compensation", compensating}};
      }
    }
    steps.push_back(std::move(step));
  }
  nlohmann::json view = {{"idempotency_key", row.key},
                         {"order_id", row.order_id},
                         {"saga", row.saga_name},
                         {"saga_version", row.saga_version},
                         {"status", ToString(row.status)},
                         {"stuck", row.stuck},
                         {"steps", steps},
                         {"trace_id", row.trace_id},
                         {"created_at", row.created_at},
                         {"updated_at", row.updated_at}};
  if (!row.failed_step.empty()) view["failed_step"] = row.failed_step;
  // Parked until one of these events is delivered (or its wait times out).
  if (!row.waiting_for.empty()) view["waiting_for"] = row.waiting_for;
  view["last_error"] = last_error;
  if (!row.cancel_requested.is_null()) {
    // A cancel takes effect at the saga's next step boundary; one that arrives while the last
    // step runs is too late, and the operator must see that it did not take effect.
    view["cancel_requested"] = row.cancel_requested;
    view["cancel_requested"]["outcome"] = CancelOutcome(row);
  }
  if (!row.resolution.is_null()) view["resolution"] = row.resolution;
  if (row.response_status != 0) {
    view["response"] = {{"status", row.response_status},
                        {"body", nlohmann::json::parse(row.response_body, nullptr, false)}};
  } else {
    view["response"] = nullptr;
  }
  return view;
}

std::optional<store::SagaRow> PathSaga(const httplib::Request& req, httplib::Response& res,
                                       TenantAuth& auth, store::ParentStore& store, size_t group) {
  auto tenant = Tenant(auth, req);
  if (!tenant) {
    SetAnswer(res, UnauthorizedAnswer());
    return std::nullopt;
  }
  auto key = PathKey(req, res, group);
  if (!key) return std::nullopt;
  auto row = store.Get(*tenant, *key);
  if (!row) SetError(res, 404, "not_found", "no saga with this Idempotency-Key");
  return row;
}

std::optional<std::string> PathKey(const httplib::Request& req, httplib::Response& res,
                                   size_t group) {
  std::string key = common::http::DecodeCapture(req.matches[group].str());
  if (common::IsValidKeyBytes(key, kMaxParentKeyLength)) return key;
  SetAnswer(res, InvalidPathKeyAnswer());
  return std::nullopt;
}

namespace {

// The run of `saga` under the path's key. Another saga's key is indistinguishable from no key
// at all, as another tenant's is: each saga's read route shows only its own runs.
void View(const store::SagaRow& row, const std::string& saga, httplib::Response& res) {
  if (row.saga_name != saga) {
    return SetError(res, 404, "not_found", "no run of this saga with this Idempotency-Key");
  }
  res.set_content(SagaView(row).dump(), "application/json");
}

}  // namespace

// The replay of a finished key whose answer is in memory, answered on the event loop (the
// server's fast handler): the tenant from the cache, the key, the body and the answer as
// StartRun reads and renders them. Anything else (a refusal, a key not cached, a first request)
// returns false and goes to StartRunAt on a worker, which answers it.
bool ReplayAt(const RunRoutes& d, const httplib::Request& req, httplib::Response& res) {
  const bool as_order = req.path == "/v1/orders";
  const steps::saga::Definition* definition =
      as_order ? d.registry.Latest(kOrderSaga) : RunsPathSaga(d, req.path);
  if (definition == nullptr) return false;
  auto tenant = d.auth.Cached(common::http::BearerToken(req));
  if (!tenant) return false;
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) return false;
  httplib::Response refused;  // a refusal is StartRun's to answer
  auto body = common::http::ParseJsonBody(req, refused, d.limits);
  if (!body) return false;
  const std::string saga = as_order ? std::string(kOrderSaga) : definition->name();
  auto outcome = d.runs.Replay(ReadRun(req, saga, *tenant, key.key, std::move(*body), as_order));
  if (!outcome) return false;
  SetAnswer(res, RunAnswer(*outcome, saga, key.key));
  return true;
}

void AddRunRoutes(common::http::Server& server, const RunRoutes& d) {
  // Database failures surface as exceptions and become 503 at the server's one catch point.
  auto start = [d](const httplib::Request& req, httplib::Response& res,
                   const common::http::EarlyAnswer& early) { StartRunAt(d, req, res, early); };
  auto replay = [d](const httplib::Request& req, httplib::Response& res) {
    return ReplayAt(d, req, res);
  };
  if (d.registry.Latest(kOrderSaga) != nullptr) server.Post("/v1/orders", start, replay);
  // Every registered saga, its latest version: /v1/runs/{saga} starts one under the request's
  // Idempotency-Key, /v1/runs/{saga}/{key} reads it. Saga names are [a-z0-9_]: no clash with
  // a key, and none with /v1/sagas (the admin listing of every saga).
  server.Post(R"(/v1/runs/([^/]+))", start, replay);
  server.Get(R"(/v1/runs/([^/]+)/(.+))", [d](const httplib::Request& req, httplib::Response& res) {
    if (auto row = PathSaga(req, res, d.auth, d.store, 2)) View(*row, req.matches[1].str(), res);
  });
  server.Get("/v1/runs", [d](const httplib::Request& req, httplib::Response& res) {
    if (!Tenant(d.auth, req)) return SetAnswer(res, UnauthorizedAnswer());
    nlohmann::json sagas = nlohmann::json::array();
    for (const auto* def : d.registry.All()) {
      nlohmann::json steps = nlohmann::json::array();
      nlohmann::json parallel = nlohmann::json::array();
      nlohmann::json children = nlohmann::json::array();
      for (const auto& step : def->steps()) {
        steps.push_back(step.name);
        if (step.group >= 0) {
          if (&step == &def->steps()[step.group]) parallel.push_back(nlohmann::json::array());
          parallel.back().push_back(step.name);
        }
        if (step.kind == steps::saga::StepKind::kChild) {
          children.push_back({{"step", step.name},
                              {"saga", step.child->name()},
                              {"version", step.child->version()}});
        }
      }
      sagas.push_back({{"name", def->name()},
                       {"version", def->version()},
                       {"steps", steps},
                       {"events", def->Events()},  // a child's are its parent's
                       {"parallel", parallel},
                       {"children", children},
                       {"path", "/v1/runs/" + def->name()}});
    }
    res.set_content(nlohmann::json{{"sagas", sagas}}.dump(), "application/json");
  });

  server.Get(R"(/v1/orders/(.+))", [d](const httplib::Request& req, httplib::Response& res) {
    if (auto row = PathSaga(req, res, d.auth, d.store)) View(*row, kOrderSaga, res);
  });
}

}  // namespace idemsaga::orchestrator::http
