// [hotel]
// The hotel: a booking is a row in its own database, committed with the step's key.
//   hotel --database-url postgresql://... --service-token T --listen 127.0.0.1:9001
#include <idemsaga/participant.hpp>

std::string ValidateCity(const nlohmann::json& body) {
  bool ok = body.is_object() && body.size() == 1 && body.contains("city") &&
            body["city"].is_string() && !body["city"].get<std::string>().empty();
  return ok ? "" : "the body must be {\"city\": \"...\"}";
}

int main(int argc, char** argv) {
  idemsaga::Participant hotel({.name = "hotel"});
  hotel.Schema(
      "CREATE TABLE IF NOT EXISTS bookings (id bigserial PRIMARY KEY, tenant_id text NOT NULL,"
      " idempotency_key text NOT NULL, city text NOT NULL,"
      " cancelled boolean NOT NULL DEFAULT false, UNIQUE (tenant_id, idempotency_key))");
  hotel.Action("/v1/bookings", ValidateCity, [](pqxx::work& tx, const idemsaga::Request& req) {
    auto id = tx.exec_params1(
        "INSERT INTO bookings (tenant_id, idempotency_key, city) VALUES ($1, $2, $3) "
        "RETURNING id",
        req.tenant_id, req.key, req.body["city"].get<std::string>())[0];
    return idemsaga::Response{201,
                              nlohmann::json{{"booking_id", "bk_" + id.as<std::string>()}}.dump()};
  });
  hotel.Compensation("/v1/bookings/cancel", [](pqxx::work& tx, const idemsaga::Request& req,
                                               const idemsaga::ActionRecord& booking) {
    tx.exec_params(
        "UPDATE bookings SET cancelled = true WHERE tenant_id = $1 AND idempotency_key = $2",
        req.tenant_id, booking.key);
    return nlohmann::json{{"cancelled", true}};
  });
  return hotel.Run(argc, argv);
}
// [hotel]
