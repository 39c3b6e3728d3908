#include "participants.hpp"

#include <httplib.h>

namespace trip {
namespace {

using steps::guard::ActionRecord;
using steps::guard::ExternalCall;
using steps::guard::Request;
using steps::guard::Response;

std::string ValidateCity(const nlohmann::json& body) {
  bool ok = body.is_object() && body.size() == 1 && body.contains("city") &&
            body["city"].is_string() && !body["city"].get<std::string>().empty();
  return ok ? "" : "the body must be {\"city\": \"...\"}";
}

// [guard-on-a-route]
// The hotel: the booking is a row in its own database, committed with the key.
void HotelRoutes(common::http::Server& server, const steps::guard::HttpGuard& http) {
  server.Post("/v1/bookings", http.Action(ValidateCity, [](pqxx::work& tx, const Request& req) {
    auto id = tx.exec_params1(
        "INSERT INTO bookings (tenant_id, idempotency_key, city) VALUES ($1, $2, $3) "
        "RETURNING id",
        req.tenant_id, req.key, req.body["city"].get<std::string>())[0];
    return Response{201, nlohmann::json{{"booking_id", "bk_" + id.as<std::string>()}}.dump()};
  }));
  server.Post("/v1/bookings/cancel",
              http.Compensation([](pqxx::work& tx, const Request& req, const ActionRecord& a) {
                tx.exec_params(
                    "UPDATE bookings SET cancelled = true "
                    "WHERE tenant_id = $1 AND idempotency_key = $2",
                    req.tenant_id, a.key);
                return nlohmann::json{{"cancelled", true}};
              }));
}

// The car desk: the rental is a call to a third party, with no transaction open. When an
// earlier attempt may have reached it (a crash mid-call), look the rental up first.
void CarRoutes(common::http::Server& server, const steps::guard::HttpGuard& http,
               const std::string& company_url) {
  server.Post(
      "/v1/rentals", http.ExternalAction(ValidateCity, [company_url](const ExternalCall& call) {
        httplib::Client company(company_url);
        const auto ref = call.request.tenant_id + ":" + call.request.key;
        if (call.earlier_attempt) {
          auto found =
              company.Get(("/rentals?ref=" + httplib::detail::encode_query_param(ref)).c_str());
          if (found && found->status == 200) {
            return Response{201, found->body};
          }
        }
        auto r = company.Post(
            "/rentals", nlohmann::json{{"ref", ref}, {"city", call.request.body["city"]}}.dump(),
            "application/json");
        if (!r) throw std::runtime_error("the rental company did not answer");  // may have rented
        if (r->status == 422) {  // a business refusal: stored and replayed like a success
          return Response{422, common::http::ErrorBody("no_cars", "no cars in this city")};
        }
        if (r->status != 201)
          throw std::runtime_error("rental company: HTTP " + std::to_string(r->status));
        return Response{201, r->body};
      }));
  server.Post("/v1/rentals/cancel",
              http.ExternalCompensation([company_url](const ExternalCall&, const ActionRecord& a) {
                httplib::Client company(company_url);
                auto id = a.body.at("rental_id").get<std::string>();
                auto r = company.Post("/rentals/" + id + "/cancel");
                if (!r || r->status != 200) throw std::runtime_error("cancel not confirmed");
                return nlohmann::json{{"cancelled", id}};
              }));
}
// [guard-on-a-route]

}  // namespace

Service::Service(Kind kind, const std::string& database_url, const std::string& token,
                 const std::string& rental_company_url)
    : pool_({.url = database_url, .size = 4}),
      guard_(pool_),
      http_(guard_, {.service_token = token}) {
  pqxx::connection conn(common::pg::WithSessionTimeouts(database_url));
  common::pg::Migrate(conn, "guard");  // the guard's key table
  if (kind == Kind::kHotel) {
    pqxx::work tx(conn);
    tx.exec(
        "CREATE TABLE IF NOT EXISTS bookings (id bigserial PRIMARY KEY, tenant_id text NOT NULL,"
        " idempotency_key text NOT NULL, city text NOT NULL,"
        " cancelled boolean NOT NULL DEFAULT false, UNIQUE (tenant_id, idempotency_key))");
    tx.commit();
    HotelRoutes(server_, http_);
  } else {
    CarRoutes(server_, http_, rental_company_url);
  }
  server_.Get(steps::guard::kPolicyPath, http_.Policy());
  port_ = server_.Bind("127.0.0.1", 0);
  thread_ = std::thread([this] { server_.Serve(); });
}

Service::~Service() {
  server_.Stop();
  thread_.join();
}

}  // namespace trip
