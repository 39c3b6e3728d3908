// Runs the trip stack against a PostgreSQL server and books two trips end to end: one that
// succeeds (and whose retry replays the same bytes), and one to Atlantis, where the car desk
// refuses and the hotel booking is cancelled. Exits 0 when every effect happened exactly as
// it should, counted in the participants' own databases.
//   trip_booking --server-url postgresql://user@127.0.0.1:5432/postgres [--db-prefix trip]
#include <httplib.h>

#include <idemsaga/orchestrator.hpp>
#include <iostream>
#include <thread>

#include "participants.hpp"
#include "rental_company.hpp"
#include "trip_saga.hpp"

namespace {

constexpr const char* kToken = "trip-service-token";
constexpr const char* kApiKey = "trip-api-key";

long long Count(const std::string& url, const std::string& sql, const std::string& key) {
  pqxx::connection conn(url);
  pqxx::nontransaction tx(conn);
  return tx.exec_params1(sql, key)[0].as<long long>();
}

bool Check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok   " : "FAIL ") << what << std::endl;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server_url, prefix = "trip";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--server-url") server_url = argv[i + 1];
    if (flag == "--db-prefix") prefix = argv[i + 1];
  }
  if (server_url.empty()) {
    std::cerr << "usage: trip_booking --server-url postgresql://... [--db-prefix trip]\n";
    return 2;
  }
  std::map<std::string, std::string> db;
  for (const char* kind : {"orchestrator", "hotel", "car"}) {
    common::pg::CreateDatabaseIfMissing(server_url, prefix + "_" + kind);
    db[kind] = common::pg::WithDatabase(server_url, prefix + "_" + kind);
  }
  {
    pqxx::connection conn(common::pg::WithSessionTimeouts(db["orchestrator"]));
    common::pg::Migrate(conn, "orchestrator");
  }
  trip::RentalCompany company;
  trip::Service hotel(trip::Service::Kind::kHotel, db["hotel"], kToken);
  trip::Service car(trip::Service::Kind::kCar, db["car"], kToken, company.Url());

  orchestrator::OrchestratorOptions options{.database_url = db["orchestrator"]};
  options.participants = {{"hotel", {.base_url = hotel.Url()}},
                          {"car", {.base_url = car.Url(), .business_errors = {"no_cars"}}}};
  options.service_token = kToken;
  orchestrator::Orchestrator orch(options, {trip::MakeTripSaga});
  orch.store().UpsertTenant("demo", common::Sha256Hex(kApiKey));
  int port = orch.Bind("127.0.0.1", 0);
  std::thread serving([&] { orch.Serve(); });

  httplib::Client client("127.0.0.1", port);
  auto book = [&](const std::string& key, const std::string& city) {
    return client.Post(
        "/v1/runs/trip",
        {{"Authorization", std::string("Bearer ") + kApiKey}, {"Idempotency-Key", key}},
        nlohmann::json{{"city", city}}.dump(), "application/json");
  };
  auto paris = book(prefix + "-paris", "Paris");
  auto again = book(prefix + "-paris", "Paris");
  auto atlantis = book(prefix + "-atlantis", "Atlantis");
  std::cout << "Paris:    " << (paris ? paris->status : 0) << " " << (paris ? paris->body : "")
            << "\nAtlantis: " << (atlantis ? atlantis->status : 0) << " "
            << (atlantis ? atlantis->body : "") << std::endl;

  bool ok = true;
  ok &= Check(paris && paris->status == 201, "Paris is booked (201)");
  ok &= Check(again && paris && again->body == paris->body &&
                  again->get_header_value("Idempotent-Replayed") == "true",
              "its retry replays the same bytes");
  ok &= Check(Count(db["hotel"],
                    "SELECT count(*) FROM bookings WHERE idempotency_key = $1 AND NOT cancelled",
                    prefix + "-paris-hotel") == 1,
              "one hotel booking for Paris");
  ok &= Check(company.rentals() == 1, "one car rented from the rental company, for Paris");
  ok &= Check(atlantis && atlantis->status == 422, "Atlantis fails with the car desk's 422");
  ok &= Check(
      Count(db["hotel"], "SELECT count(*) FROM bookings WHERE idempotency_key = $1 AND cancelled",
            prefix + "-atlantis-hotel") == 1,
      "the Atlantis hotel booking was cancelled (compensated)");
  ok &= Check(Count(db["car"],
                    "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1 "
                    "AND response_status = 422",
                    prefix + "-atlantis-car") == 1,
              "the car desk stored its refusal for Atlantis (and rented nothing)");
  ok &= Check(company.cancellations() == 0, "no rental was cancelled");
  orch.Stop();
  serving.join();
  std::cout << (ok ? "trip_booking: all checks passed" : "trip_booking: FAILED") << std::endl;
  return ok ? 0 : 1;
}
