#include <nlohmann/json.hpp>

#include "common/http/openapi.hpp"
#include "orchestrator/http/pages.hpp"
#include "orchestrator/http/trace_view.hpp"

namespace orchestrator::http {

const char* const kPageScriptPrelude = R"js("use strict";
const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
const params = new URLSearchParams(location.hash.slice(1));
if (params.get("key")) {
  localStorage.setItem("idemsaga.apiKey", params.get("key"));
  params.delete("key");  // out of the address bar and the history
  history.replaceState(null, "", location.pathname + location.search + (params.toString() ? "#" + params : ""));
}
let apiKey = localStorage.getItem("idemsaga.apiKey") || "";
$("apikey").value = apiKey;
)js";

namespace {

void SendPage(httplib::Response& res, const std::string& html) {
  res.set_content(html, "text/html; charset=utf-8");
  // It talks only to this origin, and may not be framed (its buttons act).
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                 "frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
}

}  // namespace

void AddPageRoutes(common::http::Server& server) {
  server.Get("/ui", [](const httplib::Request&, httplib::Response& res) {
    res.status = 301;
    res.set_header("Location", "/ui/");
  });
  server.Get("/ui/", [](const httplib::Request&, httplib::Response& res) {
    SendPage(res, TracePageHtml());
  });
  server.Get("/ui/sagas", [](const httplib::Request&, httplib::Response& res) {
    SendPage(res, SagasPageHtml());
  });
  common::http::AddOpenApiRoute(server, nlohmann::json::parse(OpenApiTexts().at("orchestrator")));
}

}  // namespace orchestrator::http
