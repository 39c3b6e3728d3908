#include "common/trace/view.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "common/trace/otlp.hpp"

namespace idemsaga::common::trace {

nlohmann::json SpanJson(const SpanData& s) {
  nlohmann::json attrs = AttributesJson(s.attributes);
  const char* status = s.status == SpanStatus::kError ? "error"
                       : s.status == SpanStatus::kOk  ? "ok"
                                                      : "unset";
  nlohmann::json j = {
      {"trace_id", s.trace_id},
      {"span_id", s.span_id},
      {"parent_span_id",
       s.parent_span_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.parent_span_id)},
      {"service", s.service},
      {"name", s.name},
      {"start_time_unix_nano", s.start_unix_nano},
      {"end_time_unix_nano", s.end_unix_nano},
      {"status", status},
      {"attributes", attrs}};
  if (!s.status_message.empty()) j["status_message"] = s.status_message;
  return j;
}

std::vector<std::string> PendingSpans(const std::vector<SpanData>& spans) {
  std::set<std::string> parents;
  for (const auto& s : spans) parents.insert(s.parent_span_id);
  std::vector<std::string> pending;
  for (const auto& s : spans) {
    bool answered = s.kind == SpanKind::kClient && s.attributes.count("http.status_code") != 0;
    if (answered && !parents.count(s.span_id)) pending.push_back(s.span_id);
  }
  return pending;
}

namespace {

// Attributes come from any OTLP sender: read each only if it has the expected type.
bool Flag(const nlohmann::json& a, const char* key) {
  auto it = a.find(key);
  return it != a.end() && it->is_boolean() && it->get<bool>();
}

std::string Markers(const nlohmann::json& a) {
  std::vector<std::string> m;
  if (a.contains("derived_key") && a["derived_key"].is_string()) {
    m.push_back(a["derived_key"].get<std::string>());
  }
  if (a.contains("attempt") && a["attempt"].is_number_integer()) {
    m.push_back("#" + std::to_string(a["attempt"].get<long long>()));
  }
  if (a.contains("http.status_code") && a["http.status_code"].is_number_integer()) {
    m.push_back(std::to_string(a["http.status_code"].get<long long>()));
  }
  if (Flag(a, "replayed")) m.push_back("replayed");
  for (const char* k : {"guard.outcome", "idempotency.outcome", "undo.outcome"}) {
    if (a.contains(k) && a[k].is_string()) m.push_back(a[k].get<std::string>());
  }
  if (Flag(a, "stuck")) m.push_back("STUCK");
  std::string out;
  std::set<std::string> shown;
  for (const auto& x : m) {
    if (shown.insert(x).second) out += (out.empty() ? "" : " ") + x;
  }
  return out.empty() ? out : "[" + out + "]";
}

// Pads or cuts `s` to `width` display columns (the arrow glyph is one column, three bytes).
std::string Fit(const std::string& s, size_t width) {
  size_t columns = 0, i = 0;
  while (i < s.size() && columns < width) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    i += c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    ++columns;
  }
  std::string out = s.substr(0, i);
  if (i < s.size() && width > 0) {
    out = out.substr(0, out.size() - 1) + "~";
  }
  return out + std::string(width - columns, ' ');
}

}  // namespace

std::string RenderWaterfall(const nlohmann::json& trace, int bar_width) {
  const auto& spans = trace["spans"];
  if (spans.empty()) return "no spans stored for this order yet\n";
  long long t0 = spans[0]["start_time_unix_nano"], t1 = 0;
  std::map<std::string, std::vector<const nlohmann::json*>> children;
  std::set<std::string> ids;
  for (const auto& s : spans) ids.insert(s["span_id"].get<std::string>());
  std::vector<const nlohmann::json*> roots;
  for (const auto& s : spans) {
    t0 = std::min<long long>(t0, s["start_time_unix_nano"]);
    t1 = std::max<long long>(t1, s["end_time_unix_nano"]);
    if (s["parent_span_id"].is_string() && ids.count(s["parent_span_id"])) {
      children[s["parent_span_id"]].push_back(&s);
    } else {
      roots.push_back(&s);
    }
  }
  double total = std::max<double>(1, static_cast<double>(t1 - t0));
  char head[256];
  std::snprintf(head, sizeof head, "trace %s  order %s (%s)  %zu spans  %.1f ms%s\n",
                trace.value("trace_id", "").c_str(), trace.value("idempotency_key", "").c_str(),
                trace.value("order_status", "").c_str(), spans.size(), total / 1e6,
                trace.value("complete", false) ? "" : "  (participant spans still arriving)");
  std::string out = head;
  std::string ruler = "+" + std::string(static_cast<size_t>(bar_width), '-') + "+";
  out += Fit("SERVICE", 13) + Fit("SPAN", 64) + Fit("   DURATION", 12) + ruler + "\n";
  std::function<void(const nlohmann::json&, int)> walk = [&](const nlohmann::json& s, int depth) {
    long long start = s["start_time_unix_nano"], end = s["end_time_unix_nano"];
    const auto& a = s["attributes"];
    bool comp = Flag(a, "compensation");
    std::string name = std::string(static_cast<size_t>(depth) * 2, ' ') + (comp ? "\u21a9 " : "") +
                       s["name"].get<std::string>() + " " + Markers(a);
    int from = static_cast<int>(static_cast<double>(start - t0) / total * bar_width);
    int len = std::max(1, static_cast<int>(static_cast<double>(end - start) / total * bar_width));
    from = std::min(from, bar_width - 1);
    len = std::min(len, bar_width - from);
    std::string bar(static_cast<size_t>(from), ' ');
    for (int i = 0; i < len; ++i) bar += comp ? "\u2592" : "\u2588";  // ▒ compensation, █ action
    bar += std::string(static_cast<size_t>(bar_width - from - len), ' ');
    char dur[32];
    std::snprintf(dur, sizeof dur, "%9.1f ms ", static_cast<double>(end - start) / 1e6);
    std::string status = s["status"] == "error" ? "ERROR" : s["status"] == "ok" ? "ok" : "";
    out += Fit(s["service"].get<std::string>(), 13) + Fit(name, 64) + dur + "|" + bar + "| " +
           status + "\n";
    auto kids = children[s["span_id"]];
    std::sort(kids.begin(), kids.end(), [](const auto* x, const auto* y) {
      return (*x)["start_time_unix_nano"] < (*y)["start_time_unix_nano"];
    });
    for (const auto* c : kids) walk(*c, depth + 1);
  };
  for (const auto* r : roots) walk(*r, 0);
  return out;
}

}  // namespace idemsaga::common::trace
