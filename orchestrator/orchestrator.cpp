#include "orchestrator/orchestrator.hpp"

#include <unistd.h>

#include <thread>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/trace/otlp.hpp"
#include "common/trace/trace_context.hpp"
#include "steps/guard/guard.hpp"

namespace orchestrator {
namespace {

using common::http::SetError;

void Send(const Answer& a, httplib::Response& res) {
  res.status = a.status;
  res.set_content(a.body, "application/json");
  for (const auto& [k, v] : a.headers) res.set_header(k.c_str(), v);
}

nlohmann::json SagaView(const SagaRow& row) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : row.steps) {
    if (!s.is_object()) {  // a row this build cannot read: show it as it is
      steps.push_back({{"unreadable", s}});
      continue;
    }
    steps.push_back({{"name", s.value("name", "")},
                     {"derived_key", s.value("action_key", "")},
                     {"status", s.value("status", "")},
                     {"attempts", s.value("attempts", 0)},
                     {"compensation_attempts", s.value("compensation_attempts", 0)},
                     {"replayed", s.value("replayed", false)}});
  }
  nlohmann::json view = {{"idempotency_key", row.key},
                         {"order_id", row.order_id},
                         {"saga", row.saga_name},
                         {"saga_version", row.saga_version},
                         {"status", row.status},
                         {"stuck", row.stuck},
                         {"steps", steps},
                         {"trace_id", row.trace_id},
                         {"created_at", row.created_at},
                         {"updated_at", row.updated_at}};
  if (!row.failed_step.empty()) view["failed_step"] = row.failed_step;
  if (row.response_status != 0) {
    view["response"] = {{"status", row.response_status},
                        {"body", nlohmann::json::parse(row.response_body, nullptr, false)}};
  } else {
    view["response"] = nullptr;
  }
  return view;
}

steps::client::Participants MakeParticipants(const OrchestratorOptions& o) {
  steps::client::Participants participants;
  for (auto [name, client] : o.participants) {
    client.service_token = o.service_token;
    client.read_timeout = o.participant_timeout;
    participants.Add(name, std::move(client));
  }
  return participants;
}

}  // namespace

std::optional<std::string> PathKey(const httplib::Request& req, httplib::Response& res,
                                   size_t group) {
  std::string key = common::http::DecodeCapture(req.matches[group].str());
  if (common::IsValidKeyBytes(key, kMaxParentKeyLength)) return key;
  SetError(res, 400, "idempotency_key_invalid",
           "the key in the path must be 1-" + std::to_string(kMaxParentKeyLength) +
               " printable ASCII characters (percent-encoded in the URL)");
  return std::nullopt;
}

std::string MakeOwnerId() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid()) + ":" + common::RandomHex(3);
}

Orchestrator::Orchestrator(OrchestratorOptions options,
                           const std::vector<steps::SagaFactory>& sagas)
    : options_(std::move(options)),
      pool_({.url = options_.database_url, .size = options_.pool_size}),
      store_(pool_, options_.store),
      span_pool_({.url = options_.database_url, .size = 2}),
      span_store_(span_pool_),
      exporter_(
          options_.otlp_endpoint.empty()
              ? common::trace::Exporter::Sink([this](const auto& spans) {
                  span_store_.Insert(spans);
                  return true;
                })
              : common::trace::Exporter::OtlpHttp(options_.otlp_endpoint, options_.otlp_headers),
          options_.exporter),
      tracer_("orchestrator", &exporter_),
      participants_(MakeParticipants(options_)),
      registry_([&] {
        saga::Registry registry;
        for (const auto& make : sagas) registry.Add(make(participants_));
        return registry;
      }()),
      sagas_(
          store_, registry_, options_.retry,
          [&] {
            auto s = options_.sagas;
            if (s.owner.empty()) s.owner = MakeOwnerId();
            return s;
          }(),
          &tracer_),
      recovery_(store_, sagas_, options_.recovery),
      server_([this] {
        auto limits = options_.limits;
        limits.large_bodies["/v1/traces"] = common::trace::kMaxOtlpBody;
        return limits;
      }()) {
  TraceRoutes();  // first: /v1/orders/{key}/trace must match before /v1/orders/{key}
  RunRoutes();
  Routes();
}

Orchestrator::~Orchestrator() { Stop(); }

std::chrono::seconds Orchestrator::RequiredParticipantRetention() const {
  // Actions and compensations: every step's deadline twice over, for the longest saga.
  std::chrono::milliseconds longest{0};
  for (const auto* def : registry_.All()) {
    longest = std::max(longest, 2 * saga::LongestRun(options_.retry, *def));
  }
  return options_.store.retention + std::chrono::ceil<std::chrono::seconds>(longest);
}

int Orchestrator::CheckParticipantRetention() {
  auto required = RequiredParticipantRetention();
  int checked = 0;
  for (auto [name, client] : participants_.All()) {
    std::string error;
    int status = 0;
    auto policy = client->GetJson(steps::guard::kPolicyPath, error, status);
    if (status == 0) {
      // Not up yet (participants may start after us): nothing to compare, nothing wrong.
      common::Log("retention_unchecked", {{"participant", client->base_url()}, {"error", error}});
      continue;
    }
    // A wrong token or URL (401, 404) is a misconfiguration the check must not hide.
    if (!policy || !policy->is_object() || !policy->contains("key_retention_seconds") ||
        !(*policy)["key_retention_seconds"].is_number_integer()) {
      throw std::runtime_error("participant " + client->base_url() + steps::guard::kPolicyPath +
                               " did not say how long it keeps keys (" + error +
                               "); check its URL and the service token");
    }
    std::chrono::seconds kept((*policy)["key_retention_seconds"].get<long long>());
    if (kept <= required) {
      throw std::runtime_error(
          "participant " + client->base_url() + " keeps idempotency keys for " +
          std::to_string(kept.count()) + " s, but this orchestrator needs more than " +
          std::to_string(required.count()) +
          " s (its --retention-hours plus its longest saga): a late retry or compensation could "
          "find a step key gone. Raise the participant's retention or lower this one's.");
    }
    ++checked;
  }
  return checked;
}

int Orchestrator::Bind(const std::string& host, int port) {
  int bound = server_.Bind(host, port);
  if (bound < 0) {
    throw std::runtime_error("orchestrator: cannot listen on " + host + ":" + std::to_string(port));
  }
  return bound;
}

void Orchestrator::Serve() {
  // Recovery starts with serving, not at construction: a process that fails its start-up
  // checks never takes over anyone's saga.
  recovery_.Start();
  server_.Serve();
}

void Orchestrator::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(shutdown_once_, [&] {
    server_.Stop();
    recovery_.Stop();
    auto deadline = std::chrono::steady_clock::now() + grace;
    while (sagas_.running() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    long long unfinished = sagas_.running();
    sagas_.Shutdown();
    try {
      long long released = store_.ReleaseLeases(sagas_.owner());
      common::Log("shutdown", {{"owner", sagas_.owner()},
                               {"unfinished_sagas", std::to_string(unfinished)},
                               {"leases_released", std::to_string(released)}});
    } catch (const std::exception& e) {
      // The leases expire on their own; recovery is only slower.
      common::Log("shutdown_release_failed", {{"owner", sagas_.owner()}, {"error", e.what()}});
    }
  });
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

void Orchestrator::Start(const httplib::Request& req, httplib::Response& res,
                         const saga::Definition& definition, const std::string& route) {
  // A caller's trace is continued; otherwise this request starts the saga's trace.
  auto caller = common::trace::ParseTraceparent(req.get_header_value("traceparent"));
  common::trace::SpanContext parent;
  if (caller) parent = {caller->trace_id, caller->parent_id};
  auto span = tracer_.Start("POST " + route, parent, common::trace::SpanKind::kServer);
  ResponseOnSpan on_span{span, res};
  auto tenant = Authenticate(req);
  if (!tenant) {
    SetError(res, 401, "unauthorized", "a valid API key is required (Authorization: Bearer)");
    res.set_header("WWW-Authenticate", "Bearer");
    return;
  }
  span.Set("tenant", *tenant);
  auto key =
      common::ParseIdempotencyKey(req.get_header_value_count("Idempotency-Key"),
                                  req.get_header_value("Idempotency-Key"), kMaxParentKeyLength);
  if (!key.ok()) return SetError(res, 400, key.error, key.message);
  span.Set("idempotency_key", key.key);
  auto body = common::http::ParseJsonBody(req, res, options_.limits);
  if (!body) return;
  std::shared_ptr<const std::any> input;
  try {
    input = definition.ParseInput(*body);
  } catch (const saga::InvalidInput& e) {
    return SetError(res, 400, "invalid_request", e.what());
  }
  common::Log("saga_request", {{"tenant", *tenant},
                               {"key", key.key},
                               {"saga", definition.name()},
                               {"trace_id", span.context().trace_id}});
  // The route is in the fingerprint: one key sent to two sagas is a reuse (422).
  Submission s{&definition,
               std::move(input),
               *tenant,
               key.key,
               common::Sha256Hex("POST " + route + "\n" + body->dump()),
               *body,
               span.context().trace_id,
               span.context().span_id};
  Answer answer = sagas_.Submit(s);
  span.Set("idempotency.outcome", answer.outcome).Set("replayed", answer.outcome == "replayed");
  // A retry that did not start the saga joins the saga's trace (unless the caller has a
  // trace of its own), so the replay shows in its waterfall.
  bool owns = answer.outcome == "claimed" || answer.outcome == "taken_over";
  if (!owns && !caller && !answer.trace_id.empty()) {
    span.Reparent({answer.trace_id, answer.root_span_id});
  }
  Send(answer, res);
  res.set_header("traceparent",
                 common::trace::FormatTraceparent(span.context().trace_id, span.context().span_id));
}

void Orchestrator::RunRoutes() {
  // Database failures surface as exceptions and become 503 at the server's one catch point.
  if (const auto* order = registry_.Latest(kOrderSaga)) {
    server_.Post("/v1/orders", [this, order](const httplib::Request& req, httplib::Response& res) {
      Start(req, res, *order, "/v1/orders");
    });
  }
  // Every registered saga, its latest version: /v1/runs/{saga} starts one under the request's
  // Idempotency-Key, /v1/runs/{saga}/{key} reads it. Saga names are [a-z0-9_]: no clash with
  // a key, and none with /v1/sagas (the admin listing of every saga).
  server_.Post(R"(/v1/runs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const auto* definition = registry_.Latest(req.matches[1].str());
    if (definition == nullptr) {
      return SetError(res, 404, "saga_not_found",
                      "no saga of this name is served here (GET /v1/runs lists them)");
    }
    Start(req, res, *definition, "/v1/runs/" + definition->name());
  });
  server_.Get(
      R"(/v1/runs/([^/]+)/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
        auto tenant = Authenticate(req);
        if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
        auto key = PathKey(req, res, 2);
        if (!key) return;
        auto row = store_.Get(*tenant, *key);
        // Another tenant's key, or another saga's, is indistinguishable from no key at all.
        if (!row || row->saga_name != req.matches[1].str()) {
          return SetError(res, 404, "not_found", "no run of this saga with this Idempotency-Key");
        }
        res.set_content(SagaView(*row).dump(), "application/json");
      });
  server_.Get("/v1/runs", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authenticate(req))
      return SetError(res, 401, "unauthorized", "a valid API key is required");
    nlohmann::json sagas = nlohmann::json::array();
    for (const auto* def : registry_.All()) {
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& step : def->steps()) steps.push_back(step.name);
      sagas.push_back({{"name", def->name()},
                       {"version", def->version()},
                       {"steps", steps},
                       {"path", "/v1/runs/" + def->name()}});
    }
    res.set_content(nlohmann::json{{"sagas", sagas}}.dump(), "application/json");
  });
}

std::optional<std::string> Orchestrator::Authenticate(const httplib::Request& req) {
  std::string token = common::http::BearerToken(req);
  if (token.empty() || token.size() > 256) return std::nullopt;
  std::string hash = common::Sha256Hex(token);
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(tenant_cache_mutex_);
    auto it = tenant_cache_.find(hash);
    if (it != tenant_cache_.end() && it->second.second > now) return it->second.first;
  }
  // Cached so that an order costs no extra transaction for authentication.
  auto tenant = store_.TenantForKeyHash(hash);
  if (tenant) {
    std::lock_guard lock(tenant_cache_mutex_);
    if (tenant_cache_.size() > 10000) tenant_cache_.clear();
    tenant_cache_[hash] = {*tenant, now + options_.tenant_cache_ttl};
  }
  return tenant;
}

void Orchestrator::Routes() {
  common::http::AddHealthRoutes(server_, pool_);

  server_.Get("/v1/sagas", [this](const httplib::Request& req, httplib::Response& res) {
    auto tenant = Authenticate(req);
    if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
    std::string status = req.get_param_value("status");
    if (!status.empty() && status != "started" && status != "compensating" &&
        status != "completed" && status != "failed") {
      return SetError(res, 400, "invalid_request",
                      "status must be started, compensating, completed or failed");
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
    for (const auto& row : store_.List(*tenant, status, stuck, limit))
      sagas.push_back(SagaView(row));
    res.set_content(nlohmann::json{{"sagas", sagas}}.dump(), "application/json");
  });

  server_.Post(R"(/v1/sagas/(.+)/retry)", [this](const httplib::Request& req,
                                                 httplib::Response& res) {
    auto tenant = Authenticate(req);
    if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
    auto key = PathKey(req, res);
    if (!key) return;
    auto row = store_.Get(*tenant, *key);
    if (!row) return SetError(res, 404, "not_found", "no saga with this Idempotency-Key");
    if (!store_.RetryNow(*tenant, *key)) {
      return SetError(res, 409, "not_retryable",
                      "only a running saga that is stuck can be retried; this one is " +
                          row->status + (row->stuck ? "" : ", not stuck"));
    }
    int taken = recovery_.SweepOnce();
    common::Log("saga_retry_requested",
                {{"tenant", *tenant}, {"key", *key}, {"taken_over_here", std::to_string(taken)}});
    res.status = 202;
    res.set_content(nlohmann::json{{"retrying", true}, {"idempotency_key", *key}}.dump(),
                    "application/json");
  });

  // Prometheus text format. Process counters, plus running/stuck sagas across all replicas.
  server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string out;
    auto metric = [&](const char* name, const char* type, const char* help, long long v) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
             name + " " + std::to_string(v) + "\n";
    };
    metric("idemsaga_fenced_writes_total", "counter",
           "Writes refused because this process had lost the saga's lease.",
           store_.fenced_writes());
    metric("idemsaga_sagas_resumed_total", "counter",
           "Sagas this process took over from an expired lease.", sagas_.resumed());
    metric("idemsaga_sagas_in_process", "gauge", "Sagas running in this process.",
           sagas_.running());
    try {
      auto counts = store_.CountRunning();
      metric("idemsaga_sagas_running", "gauge", "Sagas not yet ended, in all replicas.",
             counts.running);
      metric("idemsaga_sagas_stuck", "gauge",
             "Sagas whose compensation keeps failing (retried at a slower pace).", counts.stuck);
    } catch (const std::exception&) {
      metric("idemsaga_database_up", "gauge", "Whether the database answered.", 0);
    }
    res.set_content(out, "text/plain; version=0.0.4");
  });

  server_.Get(R"(/v1/orders/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    auto tenant = Authenticate(req);
    if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
    auto key = PathKey(req, res);
    if (!key) return;
    auto row = store_.Get(*tenant, *key);
    // Another tenant's key is indistinguishable from a key that does not exist.
    if (!row) return SetError(res, 404, "not_found", "no order with this Idempotency-Key");
    res.set_content(SagaView(*row).dump(), "application/json");
  });
}

}  // namespace orchestrator
