// idemsaga::App's in-process client (App::Start) against a real App serving on another
// thread, a real idemsaga::Participant, and the run's PostgreSQL: a run started in process
// is the run HTTP sees under the same key, with the same answer byte for byte.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <idemsaga/app.hpp>
#include <idemsaga/participant.hpp>
#include <idemsaga/saga.hpp>
#include <thread>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using namespace std::chrono_literals;
using State = idemsaga::RunResult::State;

constexpr const char* kToken = "app-client-token";
constexpr const char* kApiKey = "key-acme";

// A free port on loopback (bound, read, released: the App binds it again at once).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Trip {
  std::string city;
};

idemsaga::Definition MakeTripSaga(idemsaga::Participants& participants) {
  auto& hotel = participants.Get("hotel");
  using Ctx = idemsaga::StepContext;
  return idemsaga::Definition("trip", 1)
      .Input<Trip>([](const nlohmann::json& body) {
        idemsaga::Fields f(body);
        Trip trip{f.Text("city", 64)};
        f.Done();
        return trip;
      })
      .Step(
          "hotel",
          [&hotel](Ctx& c) {
            return hotel.Post("/v1/bookings", c, {{"city", c.Input<Trip>().city}});
          },
          [&hotel](Ctx& c) { return hotel.Compensate("/v1/bookings/cancel", c); });
}

class AppClient : public ::testing::Test {
 protected:
  void SetUp() override {
    // The App waits for SIGTERM on a thread of its own: every thread must block it first.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    orch_db_.Exec("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ('acme', $1)",
                  idemsaga::common::Sha256Hex(kApiKey));
    hotel_.Schema(
        "CREATE TABLE IF NOT EXISTS bookings (id bigserial PRIMARY KEY, tenant_id text NOT NULL,"
        " idempotency_key text NOT NULL, city text NOT NULL, UNIQUE (tenant_id, "
        "idempotency_key))");
    auto any_city = [](const nlohmann::json&) { return std::string(); };  // the saga checks it
    hotel_.Action("/v1/bookings", any_city, [](pqxx::work& tx, const idemsaga::Request& req) {
      auto id = tx.exec_params1(
          "INSERT INTO bookings (tenant_id, idempotency_key, city) VALUES ($1, $2, $3) "
          "RETURNING id",
          req.tenant_id, req.key, req.body["city"].get<std::string>())[0];
      return idemsaga::Response{201, nlohmann::json{{"booking_id", id.as<long long>()}}.dump()};
    });
    hotel_.Compensation("/v1/bookings/cancel",
                        [](pqxx::work&, const idemsaga::Request&, const idemsaga::ActionRecord&) {
                          return nlohmann::json{{"cancelled", true}};
                        });
    hotel_.Start("127.0.0.1", 0);
    app_.Participant("hotel", {.url = hotel_.Url()}).Saga(MakeTripSaga);
    port_ = FreePort();
  }

  void Serve() {
    serving_ = std::thread([this] {
      std::vector<std::string> args = {"trips",           "orchestrator",
                                       "--database-url",  orch_db_.url(),
                                       "--service-token", kToken,
                                       "--listen",        "127.0.0.1:" + std::to_string(port_)};
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      exit_code_ = app_.Run(static_cast<int>(argv.size()), argv.data());
    });
    ASSERT_TRUE(app_.WaitUntilServing(30s));
  }

  void TearDown() override {
    if (serving_.joinable()) {
      kill(getpid(), SIGTERM);
      serving_.join();
      EXPECT_EQ(exit_code_, 0);
    }
    hotel_.Stop();
  }

  httplib::Result PostTrip(const std::string& key, const nlohmann::json& input) {
    httplib::Client http("127.0.0.1", port_);
    http.set_read_timeout(30, 0);
    return http.Post("/v1/runs/trip",
                     {{"Authorization", std::string("Bearer ") + kApiKey},
                      {"Idempotency-Key", idemsaga::common::FormatIdempotencyKey(key)}},
                     input.dump(), "application/json");
  }

  test_support::ScratchDatabase orch_db_{"orchestrator"};
  test_support::ScratchDatabase hotel_db_{"guard"};
  idemsaga::Participant hotel_{
      {.name = "hotel", .database_url = hotel_db_.url(), .service_token = kToken}};
  idemsaga::App app_{{.name = "trips"}};
  int port_ = 0;
  int exit_code_ = -1;
  std::thread serving_;
};

TEST_F(AppClient, ARunStartedInProcessIsTheRunHttpReplaysByteForByte) {
  Serve();
  // [in-process-client]
  idemsaga::RunHandle run = app_.Start("trip", "acme", "trip-1", {{"city", "Lyon"}});
  idemsaga::RunResult r = run.Wait(30s);
  ASSERT_EQ(r.state, idemsaga::RunResult::State::kCompleted) << r.detail;
  EXPECT_EQ(r.status, 201);                    // the stored answer: its status,
  EXPECT_EQ(r.output["status"], "completed");  // its body parsed, and its bytes in r.body
  // [in-process-client]
  EXPECT_EQ(run.key(), "trip-1");
  EXPECT_FALSE(r.replayed);
  EXPECT_EQ(r.output["idempotency_key"], "trip-1");
  EXPECT_FALSE(r.trace_id.empty());
  EXPECT_EQ(run.Poll().body, r.body) << "a settled run stays as it is";
  // One booking, under the step's derived key, and one parent row with the answer stored.
  EXPECT_EQ(hotel_db_.Count("SELECT count(*) FROM bookings WHERE tenant_id = 'acme' AND "
                            "idempotency_key = 'trip-1-hotel' AND city = 'Lyon'"),
            1);
  EXPECT_EQ(orch_db_.Text("SELECT status || ' ' || response_status FROM idempotency_keys "
                          "WHERE tenant_id = 'acme' AND idempotency_key = 'trip-1'"),
            "completed 201");
  EXPECT_EQ(orch_db_.Text("SELECT response_body FROM idempotency_keys WHERE tenant_id = "
                          "'acme' AND idempotency_key = 'trip-1'"),
            r.body);

  // The same key over HTTP: the stored answer, byte for byte, marked as a replay.
  auto replay = PostTrip("trip-1", {{"city", "Lyon"}});
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 201);
  EXPECT_EQ(replay->body, r.body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  // And in process again: the same answer, a replay.
  idemsaga::RunResult again = app_.Start("trip", "acme", "trip-1", {{"city", "Lyon"}}).Wait(30s);
  ASSERT_EQ(again.state, State::kCompleted) << again.detail;
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, r.body);

  // The key with another input: refused both ways, and nothing else ran.
  auto reused = PostTrip("trip-1", {{"city", "Oslo"}});
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(nlohmann::json::parse(reused->body)["code"], "idempotency_key_reused");
  idemsaga::RunResult refused = app_.Start("trip", "acme", "trip-1", {{"city", "Oslo"}}).Wait(30s);
  EXPECT_EQ(refused.state, State::kReused);
  EXPECT_EQ(hotel_db_.Count("SELECT count(*) FROM bookings"), 1);
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys"), 1);
}

TEST_F(AppClient, ABadInputAnUnknownSagaOrAnUnknownTenantIsRefusedAndStoresNothing) {
  Serve();
  idemsaga::RunResult no_city = app_.Start("trip", "acme", "trip-2", {{"town", "Lyon"}}).Wait(30s);
  EXPECT_EQ(no_city.state, State::kInvalid);
  EXPECT_NE(no_city.detail.find("city"), std::string::npos) << no_city.detail;
  EXPECT_TRUE(no_city.Final());
  EXPECT_EQ(app_.Start("cruise", "acme", "trip-3", {{"city", "Lyon"}}).Wait(30s).state,
            State::kInvalid);
  EXPECT_EQ(app_.Start("trip", "acme", std::string(201, 'k'), {{"city", "Lyon"}}).Wait(30s).state,
            State::kInvalid);
  EXPECT_EQ(app_.Start("trip", "nobody", "trip-4", {{"city", "Lyon"}}).Wait(30s).state,
            State::kInvalid);
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(hotel_db_.Count("SELECT count(*) FROM bookings"), 0);
}

// Before Run() serves, a Start starts nothing and says so; the same key once it serves runs.
TEST_F(AppClient, AStartBeforeTheAppServesIsUnavailableAndStoresNothing) {
  idemsaga::RunResult early = app_.Start("trip", "acme", "trip-5", {{"city", "Lyon"}}).Wait(5s);
  EXPECT_EQ(early.state, State::kUnavailable);
  EXPECT_FALSE(early.Final()) << "a Start again with the key is safe";
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  Serve();
  EXPECT_EQ(app_.Start("trip", "acme", "trip-5", {{"city", "Lyon"}}).Wait(30s).state,
            State::kCompleted);
  EXPECT_EQ(hotel_db_.Count("SELECT count(*) FROM bookings"), 1);
}

}  // namespace
