// The helpers every route uses (server.hpp): the JSON body, the health routes, the bearer
// token.
#include <algorithm>
#include <cctype>

#include "common/http/request_parser.hpp"
#include "common/http/server.hpp"

namespace common::http {

using detail::IEquals;

namespace {

// Any member name or string, at any depth (bounded by the parser's depth limit), with a NUL.
bool HoldsNul(const nlohmann::json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().find('\0') != std::string::npos;
  if (j.is_array())
    return std::any_of(j.begin(), j.end(), [](const auto& e) { return HoldsNul(e); });
  if (j.is_object()) {
    for (const auto& [name, value] : j.items()) {
      if (name.find('\0') != std::string::npos || HoldsNul(value)) return true;
    }
  }
  return false;
}

}  // namespace

std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits, NulInJson nul) {
  auto type = req.get_header_value("Content-Type");
  auto semicolon = type.find(';');
  std::string media = type.substr(0, semicolon);
  while (!media.empty() && media.back() == ' ') media.pop_back();
  for (auto& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (media != "application/json") {
    SetError(res, 415, "unsupported_media_type", "Content-Type must be application/json");
    return std::nullopt;
  }
  size_t limit = BodyLimitFor(limits, req.path);
  if (req.body.size() > limit) {
    SetError(res, 413, "payload_too_large",
             "the body is larger than " + std::to_string(limit) + " bytes");
    return std::nullopt;
  }
  bool too_deep = false;
  auto depth_guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > limits.max_json_depth) too_deep = true;
    return !too_deep;
  };
  try {
    // A callback that refuses an element discards it rather than throwing; hence the flag.
    auto body = nlohmann::json::parse(req.body, depth_guard);
    if (too_deep) {
      SetError(res, 400, "invalid_json",
               "the JSON body nests deeper than " + std::to_string(limits.max_json_depth));
    } else if (nul == NulInJson::kRefuse && HoldsNul(body)) {
      // PostgreSQL stores no U+0000 in text or jsonb: refused here, once for every route,
      // rather than failing later as if the database were down.
      SetError(res, 400, "invalid_json",
               "a string in the body holds U+0000 (\\u0000), which is not accepted");
    } else {
      return body;
    }
  } catch (const nlohmann::json::exception&) {
    SetError(res, 400, "invalid_json", "the body is not valid JSON");
  }
  return std::nullopt;
}

void AddHealthRoutes(Server& server, std::function<bool()> database_ready) {
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/readyz",
             [ready = std::move(database_ready)](const httplib::Request&, httplib::Response& res) {
               if (ready()) {
                 res.set_content(R"({"status":"ready"})", "application/json");
               } else {
                 SetUnavailable(res, "the database is not reachable");
               }
             });
}

std::string BearerToken(const httplib::Request& req) {
  auto value = req.get_header_value("Authorization");
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() + 1 ||
      !IEquals(std::string_view(value).substr(0, kScheme.size()), kScheme) ||
      value[kScheme.size()] != ' ') {
    return "";
  }
  auto token = value.find_first_not_of(' ', kScheme.size());
  return token == std::string::npos ? "" : value.substr(token);
}

}  // namespace common::http
