#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/http/openapi.hpp"
#include "orchestrator/http/pages.hpp"
#include "orchestrator/saga_service.hpp"

namespace idemsaga::orchestrator::http {

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

nlohmann::json OpenApiDocument(const steps::saga::Registry& registry) {
  auto doc = nlohmann::json::parse(OpenApiTexts().at("orchestrator"));
  nlohmann::json names = nlohmann::json::array(), inputs = nlohmann::json::array();
  bool orders = false;
  for (const auto* def : registry.All()) {
    if (registry.Latest(def->name()) != def) continue;  // what a new run starts
    names.push_back(def->name());
    orders |= def->name() == kOrderSaga;
    if (std::find(inputs.begin(), inputs.end(), def->input_schema()) == inputs.end()) {
      inputs.push_back(def->input_schema());
    }
  }
  auto& start = doc["paths"]["/v1/runs/{saga}"]["post"];
  auto& saga = start["parameters"][0];
  if (!names.empty()) {
    saga["schema"]["enum"] = names;
    saga["schema"]["examples"] = names;
    saga["example"] = orders ? nlohmann::json(kOrderSaga) : names[0];
  }
  saga["description"] =
      "The saga to start: one this orchestrator serves (GET /v1/runs lists them).";
  auto& body = start["requestBody"]["content"]["application/json"];
  body["schema"] = inputs.size() == 1 ? inputs[0] : nlohmann::json{{"anyOf", inputs}};
  if (!orders) {
    body.erase("example");  // an order
    doc["paths"]["/v1/orders"].erase("post");
    if (doc["paths"]["/v1/orders"].empty()) doc["paths"].erase("/v1/orders");
  }
  return doc;
}

void AddPageRoutes(common::http::Server& server, const steps::saga::Registry& registry) {
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
  common::http::AddOpenApiRoute(server, OpenApiDocument(registry));
}

}  // namespace idemsaga::orchestrator::http
