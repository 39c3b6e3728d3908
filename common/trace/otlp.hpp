// OpenTelemetry OTLP/HTTP JSON encoding of spans (ExportTraceServiceRequest), as collectors,
// Jaeger and Tempo accept at /v1/traces: ids in hex, 64-bit integers as strings.
// Pure functions.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/trace/span.hpp"

namespace common::trace {

// Attributes as a plain JSON object ({"attempt": 2, "replayed": true, ...}).
nlohmann::json AttributesJson(const std::map<std::string, AttributeValue>& attributes);

// One resourceSpans entry per service.
nlohmann::json EncodeOtlp(const std::vector<SpanData>& spans);

// The spans of a request; nullopt (and `error`) when it is not OTLP JSON or an id is bad.
std::optional<std::vector<SpanData>> DecodeOtlp(const nlohmann::json& request, std::string& error);

}  // namespace common::trace
