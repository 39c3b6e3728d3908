// The trace intake (OTLP/HTTP JSON from participants or anyone with the service token), an
// order's trace, and the trace page.
#include <thread>

#include "common/crypto.hpp"
#include "common/log.hpp"
#include "common/trace/otlp.hpp"
#include "orchestrator/http/trace_view.hpp"
#include "orchestrator/orchestrator.hpp"

namespace orchestrator {

void Orchestrator::TraceRoutes() {
  using common::http::SetError;

  server_.Post("/v1/traces", [this](const httplib::Request& req, httplib::Response& res) {
    if (!common::ConstantTimeEquals(common::http::BearerToken(req), options_.service_token)) {
      return SetError(res, 401, "unauthorized", "the service token is required");
    }
    auto body = common::http::ParseJsonBody(req, res, server_.limits());
    if (!body) return;
    std::string error;
    auto decoded = common::trace::DecodeOtlp(*body, error);
    if (!decoded) return SetError(res, 400, "invalid_request", error);
    // Nothing acceptable in a batch that had spans: the sender's bug, named.
    if (decoded->spans.empty() && decoded->rejected > 0) {
      return SetError(res, 400, "invalid_request", decoded->error);
    }
    if (!decoded->spans.empty()) span_store_.Insert(decoded->spans);  // one commit per batch
    // OTLP partial success: the good spans are kept, the refused ones counted and named.
    nlohmann::json partial = nlohmann::json::object();
    if (decoded->rejected > 0) {
      partial = {{"rejectedSpans", std::to_string(decoded->rejected)},
                 {"errorMessage", decoded->error}};
    }
    res.set_content(nlohmann::json{{"partialSuccess", partial}}.dump(), "application/json");
  });

  server_.Get(
      R"(/v1/orders/(.+)/trace)", [this](const httplib::Request& req, httplib::Response& res) {
        auto tenant = Authenticate(req);
        if (!tenant) return SetError(res, 401, "unauthorized", "a valid API key is required");
        auto key = PathKey(req, res);
        if (!key) return;
        auto row = store_.Get(*tenant, *key);
        if (!row) return SetError(res, 404, "not_found", "no order with this Idempotency-Key");
        bool ended = row->status == "completed" || row->status == "failed";
        // Our own spans are in the exporter's queue for up to one interval; participants' may be
        // in flight a little longer. Wait briefly for an ended order's trace to be whole.
        exporter_.Flush();
        auto spans = span_store_.ForTrace(*tenant, row->trace_id);
        auto pending = PendingSpans(spans);
        auto deadline = std::chrono::steady_clock::now() + options_.trace_settle;
        while (ended && !pending.empty() && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          exporter_.Flush();
          spans = span_store_.ForTrace(*tenant, row->trace_id);
          pending = PendingSpans(spans);
        }
        nlohmann::json out = {{"trace_id", row->trace_id},   {"idempotency_key", row->key},
                              {"order_status", row->status}, {"complete", ended && pending.empty()},
                              {"pending_span_ids", pending}, {"spans", nlohmann::json::array()}};
        for (const auto& s : spans) out["spans"].push_back(SpanJson(s));
        res.set_content(out.dump(), "application/json");
      });

  server_.Get("/ui", [](const httplib::Request&, httplib::Response& res) {
    res.status = 301;
    res.set_header("Location", "/ui/");
  });
  server_.Get("/ui/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(TracePageHtml(), "text/html; charset=utf-8");
    // The page talks only to this origin.
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
  });
}

}  // namespace orchestrator
