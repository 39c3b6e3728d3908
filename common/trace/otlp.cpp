#include "common/trace/otlp.hpp"

#include <map>

#include "common/trace/trace_context.hpp"

namespace common::trace {
namespace {

nlohmann::json EncodeValue(const AttributeValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return {{"stringValue", *s}};
  if (const auto* i = std::get_if<long long>(&v)) return {{"intValue", std::to_string(*i)}};
  return {{"boolValue", std::get<bool>(v)}};
}

std::optional<AttributeValue> DecodeValue(const nlohmann::json& v) {
  if (!v.is_object()) return std::nullopt;
  if (v.contains("stringValue") && v["stringValue"].is_string()) {
    return v["stringValue"].get<std::string>();
  }
  if (v.contains("boolValue") && v["boolValue"].is_boolean()) return v["boolValue"].get<bool>();
  if (v.contains("intValue")) {
    const auto& i = v["intValue"];
    if (i.is_number_integer()) return i.get<long long>();
    if (i.is_string()) {
      try {
        return std::stoll(i.get<std::string>());
      } catch (...) {
        return std::nullopt;
      }
    }
  }
  if (v.contains("doubleValue") && v["doubleValue"].is_number()) {
    return std::to_string(v["doubleValue"].get<double>());
  }
  return std::nullopt;
}

long long DecodeNanos(const nlohmann::json& v) {
  if (v.is_number_integer()) return v.get<long long>();
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (...) {
    }
  }
  return 0;
}

}  // namespace

nlohmann::json AttributesJson(const std::map<std::string, AttributeValue>& attributes) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& entry : attributes) {
    // Not a structured binding: clang 14 cannot capture those in the lambda.
    const std::string& key = entry.first;
    std::visit([&](const auto& x) { out[key] = x; }, entry.second);
  }
  return out;
}

nlohmann::json EncodeOtlp(const std::vector<SpanData>& spans) {
  std::map<std::string, nlohmann::json> by_service;
  for (const auto& s : spans) {
    nlohmann::json attrs = nlohmann::json::array();
    for (const auto& [k, v] : s.attributes)
      attrs.push_back({{"key", k}, {"value", EncodeValue(v)}});
    nlohmann::json span = {{"traceId", s.trace_id},
                           {"spanId", s.span_id},
                           {"name", s.name},
                           {"kind", static_cast<int>(s.kind)},
                           {"startTimeUnixNano", std::to_string(s.start_unix_nano)},
                           {"endTimeUnixNano", std::to_string(s.end_unix_nano)},
                           {"attributes", attrs},
                           {"status", {{"code", static_cast<int>(s.status)}}}};
    if (!s.parent_span_id.empty()) span["parentSpanId"] = s.parent_span_id;
    if (!s.status_message.empty()) span["status"]["message"] = s.status_message;
    by_service[s.service].push_back(std::move(span));
  }
  nlohmann::json resource_spans = nlohmann::json::array();
  for (auto& [service, list] : by_service) {
    resource_spans.push_back(
        {{"resource",
          {{"attributes", {{{"key", "service.name"}, {"value", {{"stringValue", service}}}}}}}},
         {"scopeSpans", {{{"scope", {{"name", "idemsaga"}}}, {"spans", std::move(list)}}}}});
  }
  return {{"resourceSpans", resource_spans}};
}

std::optional<std::vector<SpanData>> DecodeOtlp(const nlohmann::json& req, std::string& error) {
  if (!req.is_object() || !req.contains("resourceSpans") || !req["resourceSpans"].is_array()) {
    error = "expected an OTLP ExportTraceServiceRequest with resourceSpans";
    return std::nullopt;
  }
  std::vector<SpanData> out;
  for (const auto& rs : req["resourceSpans"]) {
    std::string service = "unknown";
    if (rs.contains("resource") && rs["resource"].contains("attributes")) {
      for (const auto& a : rs["resource"]["attributes"]) {
        if (a.value("key", "") == "service.name") {
          auto v = DecodeValue(a.value("value", nlohmann::json::object()));
          if (v && std::holds_alternative<std::string>(*v)) service = std::get<std::string>(*v);
        }
      }
    }
    if (!rs.contains("scopeSpans") || !rs["scopeSpans"].is_array()) continue;
    for (const auto& ss : rs["scopeSpans"]) {
      if (!ss.contains("spans") || !ss["spans"].is_array()) continue;
      for (const auto& j : ss["spans"]) {
        SpanData s;
        s.service = service;
        s.trace_id = j.value("traceId", "");
        s.span_id = j.value("spanId", "");
        s.parent_span_id = j.value("parentSpanId", "");
        if (!IsHexId(s.trace_id, 32) || !IsHexId(s.span_id, 16) ||
            (!s.parent_span_id.empty() && !IsHexId(s.parent_span_id, 16))) {
          error = "span ids must be lower-case hex (traceId 32, spanId 16 characters)";
          return std::nullopt;
        }
        s.name = j.value("name", "");
        int kind = j.value("kind", 1);
        s.kind = kind == 2   ? SpanKind::kServer
                 : kind == 3 ? SpanKind::kClient
                             : SpanKind::kInternal;
        s.start_unix_nano = DecodeNanos(j.value("startTimeUnixNano", nlohmann::json(0)));
        s.end_unix_nano = DecodeNanos(j.value("endTimeUnixNano", nlohmann::json(0)));
        if (j.contains("status") && j["status"].is_object()) {
          int code = j["status"].value("code", 0);
          s.status = code == 2   ? SpanStatus::kError
                     : code == 1 ? SpanStatus::kOk
                                 : SpanStatus::kUnset;
          s.status_message = j["status"].value("message", "");
        }
        if (j.contains("attributes") && j["attributes"].is_array()) {
          for (const auto& a : j["attributes"]) {
            auto v = DecodeValue(a.value("value", nlohmann::json::object()));
            if (v && a.contains("key") && a["key"].is_string()) s.attributes[a["key"]] = *v;
          }
        }
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

}  // namespace common::trace
