// What the orchestrator serves for people and tools rather than for orders: the trace page
// (/ui/), the sagas page (/ui/sagas) and the API contract (/openapi.json).
#pragma once

#include <map>
#include <string>

#include "common/http/server.hpp"
#include "steps/saga/registry.hpp"

namespace idemsaga::orchestrator::http {

// The start of both pages' script: `$`, `el`, the URL's `#...` parameters as `params`, and
// the tenant API key (`#key=` or the one kept in localStorage) as `apiKey`, shown in #apikey.
extern const char* const kPageScriptPrelude;

// The self-contained trace page served at /ui/ (no CDN, no external fonts).
const std::string& TracePageHtml();

// The self-contained sagas page served at /ui/sagas.
const std::string& SagasPageHtml();

// docs/openapi/*.json of the orchestrator by name ("orchestrator"), embedded at build time.
const std::map<std::string, std::string>& OpenApiTexts();

// docs/openapi/orchestrator.json for the sagas `registry` serves: POST /v1/runs/{saga} names
// them and takes their inputs' schemas (Definition::InputSchema); POST /v1/orders is there only
// when place_order is served.
nlohmann::json OpenApiDocument(const steps::saga::Registry& registry);

// GET /ui, /ui/ (traces), /ui/sagas and /openapi.json (OpenApiDocument).
void AddPageRoutes(common::http::Server& server, const steps::saga::Registry& registry);

}  // namespace idemsaga::orchestrator::http
