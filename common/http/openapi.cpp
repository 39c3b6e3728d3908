#include "common/http/openapi.hpp"

#include <memory>
#include <stdexcept>

namespace idemsaga::common::http {

namespace {

void AddNew(nlohmann::json& into, const nlohmann::json& from, const std::string& where) {
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (into.contains(it.key())) {
      throw std::invalid_argument("OpenAPI fragment repeats " + where + " '" + it.key() + "'");
    }
    into[it.key()] = it.value();
  }
}

}  // namespace

nlohmann::json MergeOpenApi(nlohmann::json base, const nlohmann::json& fragment) {
  if (fragment.contains("info")) base["info"] = fragment["info"];
  if (fragment.contains("paths")) AddNew(base["paths"], fragment["paths"], "path");
  if (fragment.contains("components")) {
    for (auto it = fragment["components"].begin(); it != fragment["components"].end(); ++it) {
      AddNew(base["components"][it.key()], it.value(), "components." + it.key());
    }
  }
  return base;
}

void AddOpenApiRoute(Server& server, const nlohmann::json& document) {
  auto text = std::make_shared<const std::string>(document.dump(2));
  server.Get(kOpenApiPath, [text](const httplib::Request&, httplib::Response& res) {
    res.set_content(*text, "application/json");
  });
}

}  // namespace idemsaga::common::http
