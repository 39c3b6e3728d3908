// A service's OpenAPI 3.1 contract (kept in docs/openapi/, embedded at build time), served at
// GET /openapi.json so that clients and the contract test read what this very build answers.
#pragma once

#include <nlohmann/json.hpp>

#include "common/http/server.hpp"

namespace idemsaga::common::http {

inline constexpr const char* kOpenApiPath = "/openapi.json";

// `base` with `fragment`'s `info` in its place, its `paths` added, and each section of its
// `components` merged key by key (a participant's own routes over the routes every
// participant serves). A path or component in both is an error (std::invalid_argument):
// a fragment never silently replaces the shared contract.
nlohmann::json MergeOpenApi(nlohmann::json base, const nlohmann::json& fragment);

// GET /openapi.json answering `document`.
void AddOpenApiRoute(Server& server, const nlohmann::json& document);

}  // namespace idemsaga::common::http
