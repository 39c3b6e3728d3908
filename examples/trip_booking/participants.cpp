#include "participants.hpp"

namespace trip {
namespace {

using steps::guard::Request;
using steps::guard::Response;

Response Json(int status, const nlohmann::json& body) { return {status, body.dump()}; }

// Each effect writes one row keyed by the step's Idempotency-Key: the guard commits it with the
// key, once, and a retry replays the first answer instead of booking again.
void Routes(const std::string& kind, common::http::Server& server,
            const steps::guard::HttpGuard& http) {
  const std::string table = kind == "hotel" ? "bookings" : "rentals";
  auto validate = [](const nlohmann::json& body) -> std::string {
    if (!body.is_object() || !body.contains("city") || !body["city"].is_string()) {
      return "city must be a string";
    }
    return "";
  };
  server.Post(
      "/v1/" + table, http.Action(validate, [kind, table](pqxx::work& tx, const Request& req) {
        std::string city = req.body["city"];
        if (kind == "car" && city == "Atlantis") {
          return Json(422, {{"error", {{"code", "no_cars"}, {"message", "no cars in " + city}}}});
        }
        auto id = tx.exec_params1("INSERT INTO " + table +
                                      " (tenant_id, idempotency_key, city) VALUES ($1, $2, $3) "
                                      "RETURNING id",
                                  req.tenant_id, req.key, city)[0]
                      .as<long long>();
        return Json(201, {{kind + "_id", kind + "_" + std::to_string(id)}, {"city", city}});
      }));
  server.Post("/v1/" + table + "/cancel",
              http.Compensation([table](pqxx::work& tx, const Request& req,
                                        const steps::guard::ActionRecord& action) {
                tx.exec_params("UPDATE " + table +
                                   " SET cancelled = true WHERE tenant_id = $1 AND "
                                   "idempotency_key = $2",
                               req.tenant_id, action.key);
                return nlohmann::json{{"cancelled", true}};
              }));
  server.Get(steps::guard::kPolicyPath, http.Policy());
}

}  // namespace

Service::Service(const std::string& kind, const std::string& database_url, const std::string& token)
    : pool_({.url = database_url, .size = 4}),
      guard_(pool_),
      http_(guard_, {.service_token = token}) {
  {
    pqxx::connection conn(common::pg::WithSessionTimeouts(database_url));
    common::pg::Migrate(conn, "guard");  // the guard's key table
    pqxx::work tx(conn);
    tx.exec("CREATE TABLE IF NOT EXISTS " + std::string(kind == "hotel" ? "bookings" : "rentals") +
            " (id bigserial PRIMARY KEY, tenant_id text NOT NULL, idempotency_key text NOT NULL,"
            " city text NOT NULL, cancelled boolean NOT NULL DEFAULT false,"
            " UNIQUE (tenant_id, idempotency_key))");
    tx.commit();
  }
  Routes(kind, server_, http_);
  port_ = server_.Bind("127.0.0.1", 0);
  thread_ = std::thread([this] { server_.Serve(); });
}

Service::~Service() {
  server_.Stop();
  thread_.join();
}

}  // namespace trip
