// [car]
// The car desk: a rental is a row in its own database; there are no cars in Atlantis, a
// business refusal the orchestrator was told about (no_cars), stored and replayed like a rental.
//   car --database-url postgresql://... --service-token T --listen 127.0.0.1:9002
#include <idemsaga/participant.hpp>

int main(int argc, char** argv) {
  idemsaga::Participant car({.name = "car"});
  car.Schema(
      "CREATE TABLE IF NOT EXISTS rentals (id bigserial PRIMARY KEY, tenant_id text NOT NULL,"
      " idempotency_key text NOT NULL, city text NOT NULL,"
      " returned boolean NOT NULL DEFAULT false, UNIQUE (tenant_id, idempotency_key))");
  auto city = [](const nlohmann::json& body) {
    return body.contains("city") && body["city"].is_string() ? "" : "city: a string is required";
  };
  car.Action("/v1/rentals", city, [](pqxx::work& tx, const idemsaga::Request& req) {
    auto where = req.body["city"].get<std::string>();
    if (where == "Atlantis") return idemsaga::Problem(422, "no_cars", "no cars in " + where);
    auto id = tx.exec_params1(
        "INSERT INTO rentals (tenant_id, idempotency_key, city) VALUES ($1, $2, $3) "
        "RETURNING id",
        req.tenant_id, req.key, where)[0];
    return idemsaga::Response{201,
                              nlohmann::json{{"rental_id", "car_" + id.as<std::string>()}}.dump()};
  });
  car.Compensation("/v1/rentals/cancel", [](pqxx::work& tx, const idemsaga::Request& req,
                                            const idemsaga::ActionRecord& rental) {
    tx.exec_params(
        "UPDATE rentals SET returned = true WHERE tenant_id = $1 AND idempotency_key = $2",
        req.tenant_id, rental.key);
    return nlohmann::json{{"returned", true}};
  });
  return car.Run(argc, argv);
}
// [car]
