// The helpers every route uses (server.hpp): the JSON body, the health routes, the bearer
// token.
#include "common/http/server.hpp"
#include "common/request_input.hpp"

namespace idemsaga::common::http {

std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits, NulInJson nul) {
  auto body = ReadJsonBody(req.get_header_value("Content-Type"), req.body,
                           {BodyLimitFor(limits, req.path), limits.max_json_depth}, nul);
  if (!body.value) SetError(res, body.refusal.status, body.refusal.code, body.refusal.detail);
  return std::move(body.value);
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
  return BearerTokenOf(req.get_header_value("Authorization"));
}

}  // namespace idemsaga::common::http
