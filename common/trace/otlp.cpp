#include "common/trace/otlp.hpp"

#include <map>

#include "common/json_text.hpp"
#include "common/trace/trace_context.hpp"

namespace idemsaga::common::trace {
namespace {

// Text a span stores: a JSON string (so valid UTF-8: the JSON parser checks), bounded, and
// without NUL (PostgreSQL text and jsonb cannot hold it).
bool Text(const nlohmann::json& v, std::string& out, std::string& why) {
  if (!v.is_string()) {
    why = "must be a string";
    return false;
  }
  const auto& s = v.get_ref<const std::string&>();
  if (s.size() > kMaxOtlpText) {
    why = "longer than " + std::to_string(kMaxOtlpText) + " bytes";
    return false;
  }
  if (s.find('\0') != std::string::npos) {
    why = "contains NUL";
    return false;
  }
  out = s;
  return true;
}

// OTLP JSON carries 64-bit integers as decimal strings (or plain numbers).
bool Int64(const nlohmann::json& v, long long& out) {
  if (v.is_number_integer()) {
    out = v.get<long long>();
    return true;
  }
  if (!v.is_string()) return false;
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > 20 ||
      s.find_first_not_of("0123456789", s[0] == '-' ? 1 : 0) != std::string::npos || s == "-") {
    return false;
  }
  try {
    out = std::stoll(s);
    return true;
  } catch (const std::out_of_range&) {
    return false;
  }
}

bool DecodeValue(const nlohmann::json& v, AttributeValue& out, std::string& why) {
  if (!v.is_object() || v.size() != 1) {
    why = "must be an AnyValue with one of stringValue, intValue, boolValue, doubleValue";
    return false;
  }
  // Not `*v.items().begin()`: the proxy it yields refers to a temporary iterator.
  auto it = v.begin();
  const std::string kind = it.key();
  const nlohmann::json& value = it.value();
  if (kind == "stringValue") {
    std::string s;
    if (!Text(value, s, why)) return false;
    out = std::move(s);
    return true;
  }
  if (kind == "boolValue" && value.is_boolean()) {
    out = value.get<bool>();
    return true;
  }
  long long i = 0;
  if (kind == "intValue" && Int64(value, i)) {
    out = i;
    return true;
  }
  if (kind == "doubleValue" && value.is_number()) {
    out = std::to_string(value.get<double>());
    return true;
  }
  why = "mistyped " + kind;
  return false;
}

// OTLP AnyValue kinds the intake does not store (arrays, maps, bytes): valid, just skipped.
bool IsUnstoredKind(const nlohmann::json& v) {
  return v.is_object() && v.size() == 1 &&
         (v.contains("arrayValue") || v.contains("kvlistValue") || v.contains("bytesValue"));
}

// Decodes one span; on failure `why` names the field.
bool DecodeSpan(const nlohmann::json& j, const std::string& service, SpanData& s,
                std::string& why) {
  auto field = [&](const char* name) -> const nlohmann::json* {
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
  };
  auto fail = [&](const std::string& name, const std::string& reason) {
    why = name + ": " + reason;
    return false;
  };
  if (!j.is_object()) return fail("span", "must be an object");
  s.service = service;
  const auto* trace_id = field("traceId");
  if (!trace_id || !trace_id->is_string() || !IsHexId(trace_id->get<std::string>(), 32)) {
    return fail("traceId", "must be 32 lower-case hex characters");
  }
  s.trace_id = trace_id->get<std::string>();
  const auto* span_id = field("spanId");
  if (!span_id || !span_id->is_string() || !IsHexId(span_id->get<std::string>(), 16)) {
    return fail("spanId", "must be 16 lower-case hex characters");
  }
  s.span_id = span_id->get<std::string>();
  if (const auto* parent = field("parentSpanId"); parent && !parent->is_null()) {
    if (!parent->is_string() ||
        (!parent->get<std::string>().empty() && !IsHexId(parent->get<std::string>(), 16))) {
      return fail("parentSpanId", "must be empty or 16 lower-case hex characters");
    }
    s.parent_span_id = parent->get<std::string>();
  }
  const auto* name = field("name");
  if (!name) return fail("name", "is required");
  if (!Text(*name, s.name, why) || s.name.empty()) {
    return fail("name", why.empty() ? "must not be empty" : why);
  }
  long long kind = 1;
  if (const auto* k = field("kind"); k && !(Int64(*k, kind) && kind >= 0 && kind <= 5)) {
    return fail("kind", "must be an integer from 0 to 5");
  }
  s.kind = kind == 2 ? SpanKind::kServer : kind == 3 ? SpanKind::kClient : SpanKind::kInternal;
  const auto* start = field("startTimeUnixNano");
  const auto* end = field("endTimeUnixNano");
  if (!start || !Int64(*start, s.start_unix_nano) || s.start_unix_nano < 0) {
    return fail("startTimeUnixNano", "must be a non-negative 64-bit integer");
  }
  if (!end || !Int64(*end, s.end_unix_nano) || s.end_unix_nano < s.start_unix_nano) {
    return fail("endTimeUnixNano", "must be a 64-bit integer not before startTimeUnixNano");
  }
  if (const auto* status = field("status"); status && !status->is_null()) {
    if (!status->is_object()) return fail("status", "must be an object");
    long long code = 0;
    if (auto c = status->find("code");
        c != status->end() && !(Int64(*c, code) && code >= 0 && code <= 2)) {
      return fail("status.code", "must be 0, 1 or 2");
    }
    s.status = code == 2 ? SpanStatus::kError : code == 1 ? SpanStatus::kOk : SpanStatus::kUnset;
    if (auto m = status->find("message"); m != status->end() && !Text(*m, s.status_message, why)) {
      return fail("status.message", why);
    }
  }
  if (const auto* attributes = field("attributes"); attributes && !attributes->is_null()) {
    if (!attributes->is_array()) return fail("attributes", "must be an array");
    if (attributes->size() > kMaxOtlpAttributes) {
      return fail("attributes", "more than " + std::to_string(kMaxOtlpAttributes));
    }
    for (size_t i = 0; i < attributes->size(); ++i) {
      const auto& a = (*attributes)[i];
      std::string at = "attributes[" + std::to_string(i) + "]";
      std::string key;
      if (!a.is_object() || !a.contains("key") || !Text(a["key"], key, why) || key.empty()) {
        return fail(at + ".key", why.empty() ? "must be a non-empty string" : why);
      }
      AttributeValue value;
      if (a.contains("value") && IsUnstoredKind(a["value"])) continue;
      if (!a.contains("value") || !DecodeValue(a["value"], value, why)) {
        return fail(at + ".value", why.empty() ? "is required" : why);
      }
      s.attributes[key] = std::move(value);
    }
  }
  return true;
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

void AppendAttributesJson(std::string& out,
                          const std::map<std::string, AttributeValue>& attributes) {
  out.push_back('{');
  bool first = true;
  for (const auto& [key, value] : attributes) {
    if (!first) out.push_back(',');
    first = false;
    json::AppendString(out, key);
    out.push_back(':');
    if (const auto* s = std::get_if<std::string>(&value)) {
      json::AppendString(out, *s);
    } else if (const auto* i = std::get_if<long long>(&value)) {
      out.append(std::to_string(*i));
    } else {
      out.append(std::get<bool>(value) ? "true" : "false");
    }
  }
  out.push_back('}');
}

std::string EncodeOtlp(const std::vector<SpanData>& spans) {
  // Written as text, a span at a time: a document of a batch of 1,000 spans was the largest
  // thing in the server's heap.
  std::map<std::string_view, std::vector<const SpanData*>> by_service;
  for (const auto& s : spans) by_service[s.service].push_back(&s);
  std::string out = R"({"resourceSpans":[)";
  out.reserve(spans.size() * 400);
  bool first_service = true;
  for (const auto& [service, list] : by_service) {
    if (!first_service) out.push_back(',');
    first_service = false;
    out.append(R"({"resource":{"attributes":[{"key":"service.name","value":{"stringValue":)");
    json::AppendString(out, service);
    out.append(R"(}}]},"scopeSpans":[{"scope":{"name":"idemsaga"},"spans":[)");
    for (size_t i = 0; i < list.size(); ++i) {
      const SpanData& s = *list[i];
      if (i > 0) out.push_back(',');
      out.append(R"({"traceId":)");
      json::AppendString(out, s.trace_id);
      out.append(R"(,"spanId":)");
      json::AppendString(out, s.span_id);
      if (!s.parent_span_id.empty()) {
        out.append(R"(,"parentSpanId":)");
        json::AppendString(out, s.parent_span_id);
      }
      out.append(R"(,"name":)");
      json::AppendString(out, s.name);
      out.append(R"(,"kind":)").append(std::to_string(static_cast<int>(s.kind)));
      out.append(R"(,"startTimeUnixNano":")").append(std::to_string(s.start_unix_nano));
      out.append(R"(","endTimeUnixNano":")").append(std::to_string(s.end_unix_nano));
      out.append(R"(","attributes":[)");
      bool first_attribute = true;
      for (const auto& [key, value] : s.attributes) {
        if (!first_attribute) out.push_back(',');
        first_attribute = false;
        out.append(R"({"key":)");
        json::AppendString(out, key);
        if (const auto* text = std::get_if<std::string>(&value)) {
          out.append(R"(,"value":{"stringValue":)");
          json::AppendString(out, *text);
          out.append("}}");
        } else if (const auto* n = std::get_if<long long>(&value)) {
          out.append(R"(,"value":{"intValue":")").append(std::to_string(*n)).append("\"}}");
        } else {
          out.append(R"(,"value":{"boolValue":)")
              .append(std::get<bool>(value) ? "true" : "false")
              .append("}}");
        }
      }
      out.append(R"(],"status":{"code":)").append(std::to_string(static_cast<int>(s.status)));
      if (!s.status_message.empty()) {
        out.append(R"(,"message":)");
        json::AppendString(out, s.status_message);
      }
      out.append("}}");
    }
    out.append("]}]}");
  }
  out.append("]}");
  return out;
}

std::vector<std::string> EncodeOtlpFitting(const std::vector<SpanData>& spans, size_t max_body) {
  std::vector<std::string> bodies;
  std::string body = EncodeOtlp(spans);
  if (body.size() <= max_body || spans.size() <= 1) {
    bodies.push_back(std::move(body));
    return bodies;
  }
  auto middle = spans.begin() + static_cast<std::ptrdiff_t>(spans.size() / 2);
  for (const auto& part :
       {std::vector<SpanData>(spans.begin(), middle), std::vector<SpanData>(middle, spans.end())}) {
    for (auto& b : EncodeOtlpFitting(part, max_body)) bodies.push_back(std::move(b));
  }
  return bodies;
}

std::optional<DecodedOtlp> DecodeOtlp(const nlohmann::json& req, std::string& error) {
  if (!req.is_object() || !req.contains("resourceSpans") || !req["resourceSpans"].is_array()) {
    error = "expected an OTLP ExportTraceServiceRequest with a resourceSpans array";
    return std::nullopt;
  }
  DecodedOtlp out;
  auto refuse = [&](long long spans, const std::string& message) {
    out.rejected += spans;
    if (out.error.empty()) out.error = message;
  };
  const auto& all = req["resourceSpans"];
  for (size_t r = 0; r < all.size(); ++r) {
    const auto& rs = all[r];
    std::string at = "resourceSpans[" + std::to_string(r) + "]";
    if (!rs.is_object()) {
      refuse(0, at + ": must be an object");
      continue;
    }
    std::string service = "unknown";
    if (auto res = rs.find("resource"); res != rs.end() && res->is_object()) {
      if (auto attrs = res->find("attributes"); attrs != res->end() && attrs->is_array()) {
        for (const auto& a : *attrs) {
          if (!a.is_object()) continue;
          if (auto key = a.find("key"); key == a.end() || *key != "service.name") continue;
          AttributeValue v;
          std::string why;
          if (a.contains("value") && DecodeValue(a["value"], v, why) &&
              std::holds_alternative<std::string>(v) && !std::get<std::string>(v).empty() &&
              std::get<std::string>(v).size() <= 256) {
            service = std::get<std::string>(v);
          }
        }
      }
    }
    auto scopes = rs.find("scopeSpans");
    if (scopes == rs.end() || !scopes->is_array()) continue;
    for (size_t sc = 0; sc < scopes->size(); ++sc) {
      const auto& ss = (*scopes)[sc];
      std::string scope_at = at + ".scopeSpans[" + std::to_string(sc) + "]";
      if (!ss.is_object()) continue;
      auto spans = ss.find("spans");
      if (spans == ss.end()) continue;
      if (!spans->is_array()) {
        refuse(0, scope_at + ".spans: must be an array");
        continue;
      }
      for (size_t i = 0; i < spans->size(); ++i) {
        SpanData s;
        std::string why;
        if (DecodeSpan((*spans)[i], service, s, why)) {
          out.spans.push_back(std::move(s));
        } else {
          refuse(1, scope_at + ".spans[" + std::to_string(i) + "]." + why);
        }
      }
    }
  }
  return out;
}

}  // namespace idemsaga::common::trace
