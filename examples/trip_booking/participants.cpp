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

// The car desk: the rental is a call to a third party, with no transaction open, over by the
// call's deadline. Where an earlier attempt may have reached the company (a crash mid-call),
// the rental is looked up by our reference before another is made.
httplib::Client Company(const std::string& url, const ExternalCall& call) {
  httplib::Client company(url);
  auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                           call.deadline - std::chrono::steady_clock::now()),
                       std::chrono::milliseconds(1));
  company.set_connection_timeout(left);
  company.set_read_timeout(left);  // per read: these answers are one read each
  return company;
}

// The rental made under `ref`, or null; throws when the company cannot say.
nlohmann::json FindRental(httplib::Client& company, const std::string& ref) {
  auto found = company.Get("/rentals", httplib::Params{{"ref", ref}}, httplib::Headers{});
  if (found && found->status == 404) return nullptr;
  if (!found || found->status != 200) throw std::runtime_error("rental lookup failed");
  return nlohmann::json::parse(found->body);
}

void CarRoutes(common::http::Server& server, const steps::guard::HttpGuard& http,
               const std::string& url) {
  server.Post("/v1/rentals", http.ExternalAction(ValidateCity, [url](const ExternalCall& call) {
    auto company = Company(url, call);
    const auto ref = call.request.tenant_id + ":" + call.request.key;
    if (call.earlier_attempt) {
      if (auto rental = FindRental(company, ref); !rental.is_null()) {
        return Response{201, rental.dump()};
      }
    }
    auto r = company.Post("/rentals",
                          nlohmann::json{{"ref", ref}, {"city", call.request.body["city"]}}.dump(),
                          "application/json");
    if (!r) throw std::runtime_error("the rental company did not answer");  // may have rented
    if (r->status == 422) {  // a business refusal: stored and replayed like a success
      return steps::guard::Problem(422, "no_cars", "no cars in this city");
    }
    if (r->status != 201) throw std::runtime_error("rental company: " + std::to_string(r->status));
    return Response{201, r->body};
  }));
  server.Post("/v1/rentals/cancel",
              http.ExternalCompensation([url](const ExternalCall& call, const ActionRecord& a) {
                auto company = Company(url, call);
                // status 0: the rental call was cut off mid-way; whether it rented is for the
                // company to say.
                auto rental = a.status != 0
                                  ? a.body
                                  : FindRental(company, call.request.tenant_id + ":" + a.key);
                if (rental.is_null()) return nlohmann::json{{"cancelled", nullptr}};
                auto id = rental.at("rental_id").get<std::string>();
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
