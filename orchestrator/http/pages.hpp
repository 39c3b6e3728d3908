// What the orchestrator serves for people and tools rather than for orders: the trace page
// (/ui/), the sagas page (/ui/sagas) and the API contract (/openapi.json).
#pragma once

#include <map>
#include <string>

#include "common/http/server.hpp"

namespace orchestrator::http {

// The start of both pages' script: `$`, `el`, the URL's `#...` parameters as `params`, and
// the tenant API key (`#key=` or the one kept in localStorage) as `apiKey`, shown in #apikey.
extern const char* const kPageScriptPrelude;

// The self-contained sagas page served at /ui/sagas.
const std::string& SagasPageHtml();

// docs/openapi/*.json of the orchestrator by name ("orchestrator"), embedded at build time.
const std::map<std::string, std::string>& OpenApiTexts();

// GET /ui, /ui/ (traces), /ui/sagas and /openapi.json.
void AddPageRoutes(common::http::Server& server);

}  // namespace orchestrator::http
