// The runs API: POST /v1/orders and /v1/runs/{saga} start a saga under an Idempotency-Key;
// GET reads one.
#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/trace/trace_context.hpp"
#include "orchestrator/http/routes.hpp"

namespace orchestrator::http {
namespace {

using common::http::SetError;

// A saga's answer as HTTP, with the traceparent of the request's span.
void Send(const Answer& a, const std::string& traceparent, httplib::Response& res) {
  res.status = a.status;
  auto type = a.headers.find("Content-Type");
  res.set_content(a.body, type == a.headers.end() ? "application/json" : type->second.c_str());
  for (const auto& [k, v] : a.headers) {
    if (k != "Content-Type") res.set_header(k.c_str(), v);
  }
  res.set_header("traceparent", traceparent);
}

// Records the response's status on the request's span, however the handler returns.
struct ResponseOnSpan {
  common::trace::Span& span;
  const httplib::Response& res;
  ~ResponseOnSpan() {
    span.Set("http.status_code", static_cast<long long>(res.status));
    if (res.status >= 400) {
      span.Error("HTTP " + std::to_string(res.status));
    } else {
      span.Ok();
    }
  }
};

}  // namespace

KeyOutcome StartRun(const RunRoutes& d, const httplib::Request& req, httplib::Response& res,
                    const saga::Definition& definition, const std::string& route) {
  // A caller's trace is continued; otherwise this request starts the saga's trace.
  auto caller = common::trace::ParseTraceparent(req.get_header_value("traceparent"));
  common::trace::SpanContext parent;
  if (caller) parent = {caller->trace_id, caller->parent_id};
  auto span = d.tracer.Start("POST " + route, parent, common::trace::SpanKind::kServer);
  ResponseOnSpan on_span{span, res};
  auto tenant = d.auth(req);
  if (!tenant) {
    SetError(res, 401, "unauthorized", "a valid API key is required (Authorization: Bearer)");
    res.set_header("WWW-Authenticate", "Bearer");
    return KeyOutcome::kNone;
  }
  span.Set("tenant", *tenant);
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) {
    SetError(res, 400, key.error, key.message);
    return KeyOutcome::kNone;
  }
  span.Set("idempotency_key", key.key);
  auto body = common::http::ParseJsonBody(req, res, d.limits);
  if (!body) return KeyOutcome::kNone;
  std::shared_ptr<const std::any> input;
  try {
    input = definition.ParseInput(*body);
  } catch (const saga::InvalidInput& e) {
    SetError(res, 400, "invalid_request", e.what());
    return KeyOutcome::kNone;
  }
  // The route is in the fingerprint: one key sent to two sagas is a reuse (422).
  ClaimRequest request{
      .tenant_id = *tenant,
      .key = key.key,
      .request_hash = common::RequestFingerprint("POST", route, *body),
      .request_body = *body,
      .trace_id = span.context().trace_id,
      .root_span_id = span.context().span_id,
  };
  Submission s{&definition, std::move(input), std::move(request)};
  if (auto early = common::http::EarlyAnswer::ForCurrentRequest()) {
    // The saga's 202 when it outlives the response budget; the saga's own span is this
    // request's, so the traceparent is already known.
    s.answer_early = [early,
                      traceparent = common::trace::FormatTraceparent(
                          span.context().trace_id, span.context().span_id)](const Answer& a) {
      httplib::Response r;
      Send(a, traceparent, r);
      return early.Send(std::move(r));
    };
  }
  Answer answer = d.sagas.Submit(s);
  if (answer.deferred) {
    // The saga's answer follows through s.answer_early; this span records the 202 it would
    // be at the latest, the saga's own span what it became.
    span.Set("idempotency.outcome", std::string(ToString(answer.outcome))).Set("replayed", false);
    res.status = 202;
    common::http::DeferAnswer(res);
    return answer.outcome;
  }
  // A request that starts or resumes the saga is logged by it (saga_started, saga_resumed);
  // one line per request, not two.
  if (!answer.Owns()) {
    common::Log("saga_request", {{"tenant", *tenant},
                                 {"key", key.key},
                                 {"saga", definition.name()},
                                 {"outcome", ToString(answer.outcome)},
                                 {"http_status", std::to_string(answer.status)},
                                 {"trace_id", answer.trace_id.empty() ? span.context().trace_id
                                                                      : answer.trace_id}});
  }
  span.Set("idempotency.outcome", std::string(ToString(answer.outcome)))
      .Set("replayed", answer.outcome == KeyOutcome::kReplayed);
  // A retry that did not start the saga joins the saga's trace (unless the caller has a
  // trace of its own), so the replay shows in its waterfall.
  if (!answer.Owns() && !caller && !answer.trace_id.empty()) {
    span.Reparent({answer.trace_id, answer.root_span_id});
  }
  Send(answer, common::trace::FormatTraceparent(span.context().trace_id, span.context().span_id),
       res);
  return answer.outcome;
}

namespace {

// What became of an operator's cancel: "pending" (no step boundary reached yet),
// "compensating" (the saga is being undone), "took_effect" (it ended undone for the cancel:
// 409 saga_cancelled), "too_late" (its last step had begun: it completed, and its answer
// stands), or "overtaken" (it failed for its own reason first).
const char* CancelOutcome(const SagaRow& row) {
  switch (row.status) {
    case SagaStatus::kStarted:
      return "pending";
    case SagaStatus::kCompensating:
      return "compensating";
    case SagaStatus::kCompleted:
      return "too_late";
    case SagaStatus::kFailed:
      break;
  }
  auto [code, detail] =
      common::http::ErrorOf(nlohmann::json::parse(row.response_body, nullptr, false));
  return code == "saga_cancelled" ? "took_effect" : "overtaken";
}

}  // namespace

nlohmann::json SagaView(const SagaRow& row) {
  nlohmann::json steps = nlohmann::json::array();
  // What an operator reads first: the compensation that is stuck, else the step that failed,
  // else the latest step that recorded an error (a retried attempt, say).
  nlohmann::json last_error;
  int last_error_rank = 0;
  for (const auto& s : row.steps) {
    if (!s.is_object()) {  // a row this build cannot read: show it as it is
      steps.push_back({{"unreadable", s}});
      continue;
    }
    std::string status = s.value("status", "");
    nlohmann::json step = {{"name", s.value("name", "")},
                           {"derived_key", s.value("action_key", "")},
                           {"status", status},
                           {"attempts", s.value("attempts", 0)},
                           {"compensation_attempts", s.value("compensation_attempts", 0)},
                           {"replayed", s.value("replayed", false)}};
    std::string detail = s.value("detail", "");
    if (!detail.empty()) {
      step["detail"] = detail;
      bool compensating = status == "compensating";
      int rank = compensating ? 3 : step["name"] == row.failed_step ? 2 : 1;
      if (rank >= last_error_rank) {
        last_error_rank = rank;
        last_error = {{"step", step["name"]},
                      {"detail", detail},
                      {"attempts", compensating ? step["compensation_attempts"] : step["attempts"]},
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

std::optional<SagaRow> PathSaga(const httplib::Request& req, httplib::Response& res,
                                TenantAuth& auth, ParentStore& store, size_t group) {
  auto tenant = auth(req);
  if (!tenant) {
    SetError(res, 401, "unauthorized", "a valid API key is required");
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
  SetError(res, 400, "idempotency_key_invalid",
           "the key in the path must be 1-" + std::to_string(kMaxParentKeyLength) +
               " printable ASCII characters (percent-encoded in the URL)");
  return std::nullopt;
}

namespace {

// The run of `saga` under the path's key. Another saga's key is indistinguishable from no key
// at all, as another tenant's is: each saga's read route shows only its own runs.
void View(const SagaRow& row, const std::string& saga, httplib::Response& res) {
  if (row.saga_name != saga) {
    return SetError(res, 404, "not_found", "no run of this saga with this Idempotency-Key");
  }
  res.set_content(SagaView(row).dump(), "application/json");
}

}  // namespace

KeyOutcome StartRunAt(const RunRoutes& d, const httplib::Request& req, httplib::Response& res) {
  constexpr std::string_view kRuns = "/v1/runs/";
  if (req.path == "/v1/orders") {
    if (const auto* order = d.registry.Latest(kOrderSaga)) {
      return StartRun(d, req, res, *order, "/v1/orders");
    }
  }
  // Who asks first: which sagas are served is not for anyone without a key.
  if (!d.auth(req)) {
    SetError(res, 401, "unauthorized", "a valid API key is required (Authorization: Bearer)");
    res.set_header("WWW-Authenticate", "Bearer");
    return KeyOutcome::kNone;
  }
  const saga::Definition* definition = nullptr;
  if (std::string_view(req.path).substr(0, kRuns.size()) == kRuns) {
    definition = d.registry.Latest(std::string_view(req.path).substr(kRuns.size()));
  }
  if (definition == nullptr) {
    SetError(res, 404, "saga_not_found",
             "no saga of this name is served here (GET /v1/runs lists them)");
    return KeyOutcome::kNone;
  }
  return StartRun(d, req, res, *definition, "/v1/runs/" + definition->name());
}

void AddRunRoutes(common::http::Server& server, const RunRoutes& d) {
  // Database failures surface as exceptions and become 503 at the server's one catch point.
  if (const auto* order = d.registry.Latest(kOrderSaga)) {
    server.Post("/v1/orders", [d, order](const httplib::Request& req, httplib::Response& res) {
      StartRun(d, req, res, *order, "/v1/orders");
    });
  }
  // Every registered saga, its latest version: /v1/runs/{saga} starts one under the request's
  // Idempotency-Key, /v1/runs/{saga}/{key} reads it. Saga names are [a-z0-9_]: no clash with
  // a key, and none with /v1/sagas (the admin listing of every saga).
  server.Post(R"(/v1/runs/([^/]+))", [d](const httplib::Request& req, httplib::Response& res) {
    StartRunAt(d, req, res);
  });
  server.Get(R"(/v1/runs/([^/]+)/(.+))", [d](const httplib::Request& req, httplib::Response& res) {
    if (auto row = PathSaga(req, res, d.auth, d.store, 2)) View(*row, req.matches[1].str(), res);
  });
  server.Get("/v1/runs", [d](const httplib::Request& req, httplib::Response& res) {
    if (!d.auth(req)) return SetError(res, 401, "unauthorized", "a valid API key is required");
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
        if (step.kind == saga::StepKind::kChild) {
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

}  // namespace orchestrator::http
