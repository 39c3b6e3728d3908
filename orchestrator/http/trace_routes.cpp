// The trace intake (OTLP/HTTP JSON from participants or anyone with the service token), an
// order's trace.
#include <thread>

#include "common/crypto.hpp"
#include "common/log.hpp"
#include "common/trace/otlp.hpp"
#include "common/trace/view.hpp"
#include "orchestrator/http/routes.hpp"

namespace idemsaga::orchestrator::http {

void AddTraceRoutes(common::http::Server& server, const TraceRoutes& d) {
  using common::http::SetError;

  server.Post("/v1/traces", [d, &server](const httplib::Request& req, httplib::Response& res) {
    if (!common::ConstantTimeEquals(common::http::BearerToken(req), d.service_token)) {
      return SetError(res, 401, "unauthorized", "the service token is required");
    }
    // Each span's text is checked by DecodeOtlp, which refuses a span with a NUL alone.
    auto body = common::http::ParseJsonBody(req, res, server.limits(),
                                            common::NulInJson::kCallerChecksFields);
    if (!body) return;
    std::string error;
    auto decoded = common::trace::DecodeOtlp(*body, error);
    if (!decoded) return SetError(res, 400, "invalid_request", error);
    // Nothing acceptable in a batch that had spans: the sender's bug, named.
    if (decoded->spans.empty() && decoded->rejected > 0) {
      return SetError(res, 400, "invalid_request", decoded->error);
    }
    if (!decoded->spans.empty()) d.spans.Insert(decoded->spans);  // one commit per batch
    // OTLP partial success: the good spans are kept, the refused ones counted and named.
    nlohmann::json partial = nlohmann::json::object();
    if (decoded->rejected > 0) {
      partial = {{"rejectedSpans", std::to_string(decoded->rejected)},
                 {"errorMessage", decoded->error}};
    }
    res.set_content(nlohmann::json{{"partialSuccess", partial}}.dump(), "application/json");
  });

  server.Get(R"(/v1/orders/(.+)/trace)", [d](const httplib::Request& req, httplib::Response& res) {
    auto row = PathSaga(req, res, d.auth, d.store);
    if (!row) return;
    const std::string& tenant = row->tenant_id;
    bool ended = store::Finished(row->status);
    // Our own spans are in the exporter's queue for up to one interval; participants' may be
    // in flight a little longer. Wait briefly for an ended order's trace to be whole.
    d.exporter.Flush();
    auto spans = d.spans.ForTrace(tenant, row->trace_id);
    auto pending = common::trace::PendingSpans(spans);
    auto deadline = std::chrono::steady_clock::now() + d.settle;
    while (ended && !pending.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      d.exporter.Flush();
      spans = d.spans.ForTrace(tenant, row->trace_id);
      pending = common::trace::PendingSpans(spans);
    }
    nlohmann::json out = {{"trace_id", row->trace_id},
                          {"idempotency_key", row->key},
                          {"order_status", ToString(row->status)},
                          {"complete", ended && pending.empty()},
                          {"pending_span_ids", pending},
                          {"spans", nlohmann::json::array()}};
    for (const auto& s : spans) out["spans"].push_back(common::trace::SpanJson(s));
    res.set_content(out.dump(), "application/json");
  });
}

}  // namespace idemsaga::orchestrator::http
