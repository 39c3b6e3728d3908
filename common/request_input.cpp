#include "common/request_input.hpp"

#include <algorithm>
#include <cctype>

#include "common/strings.hpp"

namespace idemsaga::common {
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

JsonBody Refused(int status, std::string code, std::string detail) {
  return {std::nullopt, {status, std::move(code), std::move(detail)}};
}

}  // namespace

JsonBody ReadJsonBody(std::string_view content_type, std::string_view body,
                      const JsonLimits& limits, NulInJson nul) {
  std::string media(content_type.substr(0, content_type.find(';')));
  while (!media.empty() && media.back() == ' ') media.pop_back();
  for (auto& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (media != "application/json") {
    return Refused(415, "unsupported_media_type", "Content-Type must be application/json");
  }
  if (body.size() > limits.max_bytes) {
    return Refused(413, "payload_too_large",
                   "the body is larger than " + std::to_string(limits.max_bytes) + " bytes");
  }
  bool too_deep = false;
  auto depth_guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > limits.max_depth) too_deep = true;
    return !too_deep;
  };
  try {
    // A callback that refuses an element discards it rather than throwing; hence the flag.
    auto json = nlohmann::json::parse(body, depth_guard);
    if (too_deep) {
      return Refused(400, "invalid_json",
                     "the JSON body nests deeper than " + std::to_string(limits.max_depth));
    }
    if (nul == NulInJson::kRefuse && HoldsNul(json)) {
      // PostgreSQL stores no U+0000 in text or jsonb: refused here, once for every way in,
      // rather than failing later as if the database were down.
      return Refused(400, "invalid_json",
                     "a string in the body holds U+0000 (\\u0000), which is not accepted");
    }
    return {std::move(json), {}};
  } catch (const nlohmann::json::exception&) {
    return Refused(400, "invalid_json", "the body is not valid JSON");
  }
}

std::string BearerTokenOf(std::string_view value) {
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() + 1 || !IEquals(value.substr(0, kScheme.size()), kScheme) ||
      value[kScheme.size()] != ' ') {
    return "";
  }
  auto token = value.find_first_not_of(' ', kScheme.size());
  return token == std::string_view::npos ? "" : std::string(value.substr(token));
}

}  // namespace idemsaga::common
