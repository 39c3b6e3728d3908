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

namespace idemsaga::common::trace {

// Attributes as a plain JSON object ({"attempt": 2, "replayed": true, ...}).
nlohmann::json AttributesJson(const std::map<std::string, AttributeValue>& attributes);

// The same object, appended to `out` as text.
void AppendAttributesJson(std::string& out,
                          const std::map<std::string, AttributeValue>& attributes);

// An ExportTraceServiceRequest as JSON text: one resourceSpans entry per service.
std::string EncodeOtlp(const std::vector<SpanData>& spans);

// The largest OTLP request the intake (POST /v1/traces) takes.
inline constexpr size_t kMaxOtlpBody = size_t{4} * 1024 * 1024;

// `spans` as requests of at most `max_body` bytes each, halving a batch until it fits (a span
// alone over the limit goes on its own: the intake refuses it, and only it).
std::vector<std::string> EncodeOtlpFitting(const std::vector<SpanData>& spans,
                                           size_t max_body = kMaxOtlpBody);

// Limits on what the intake stores (our spans are far below them).
inline constexpr size_t kMaxOtlpText = 4096;       // bytes of a name, message or string value
inline constexpr size_t kMaxOtlpAttributes = 128;  // per span

struct DecodedOtlp {
  std::vector<SpanData> spans;  // every span that passed validation
  long long rejected = 0;       // spans refused, each for a field named in `error`
  std::string error;            // the first refusal: "<path>.<field>: <why>"
};

// Decodes an ExportTraceServiceRequest, validating every field a span stores (ids, name,
// kind, times, status, attributes; text is UTF-8 without NUL, which PostgreSQL cannot store).
// A bad span is refused on its own (OTLP partial success); nullopt (and `error`) only when the
// request itself is not OTLP JSON.
std::optional<DecodedOtlp> DecodeOtlp(const nlohmann::json& request, std::string& error);

}  // namespace idemsaga::common::trace
