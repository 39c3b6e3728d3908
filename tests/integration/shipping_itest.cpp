// The shipping participant (demo/shipping.cpp) over real HTTP (a server on port 0)
// against real PostgreSQL: what its guard promises, counted in its shipments table.
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using test_support::Call;
using test_support::ErrorCode;
using test_support::Post;
using test_support::ScratchDatabase;
using Running = test_support::Serving<ParticipantService>;

constexpr const char* kToken = idemsaga::demo::kServiceToken;
constexpr const char* kReservation = "res_0123456789abcdef0123456789abcdef";
constexpr const char* kShipment =
    R"({"reservation_id":"res_0123456789abcdef0123456789abcdef","address":{"name":"Ada Lovelace","line1":"12 St James's Square","city":"London","postal_code":"SW1Y 4JH","country":"GB"}})";
// The same request, its keys in another order and spaced out: the same fingerprint.
constexpr const char* kShipmentReordered = R"({ "address" : { "country" : "GB",
    "postal_code" : "SW1Y 4JH", "city" : "London", "line1" : "12 St James's Square",
    "name" : "Ada Lovelace" }, "reservation_id" : "res_0123456789abcdef0123456789abcdef" })";
constexpr const char* kUnserviceable =
    R"({"reservation_id":"res_0123456789abcdef0123456789abcdef","address":{"name":"Base","line1":"Ross Island","city":"McMurdo","postal_code":"9999","country":"AQ"}})";

class ShippingTest : public ::testing::Test {
 protected:
  ShippingTest()
      : db_("shipping"),
        svc_(ParticipantKind::kShipping, db_.url(),
             idemsaga::demo::ParticipantOptions{.pool_size = 8}),
        client_(svc_.Client()) {}

  long long Shipments() const { return db_.Count("SELECT count(*) FROM shipments"); }
  long long Shipments(const std::string& status) const {
    return db_.Count("SELECT count(*) FROM shipments WHERE status = $1", status);
  }
  long long Keys() const { return db_.Count("SELECT count(*) FROM idempotency_keys"); }
  httplib::Result Get(const std::string& id, const std::string& tenant = "demo") {
    httplib::Headers headers = {{"Authorization", std::string("Bearer ") + kToken}};
    if (!tenant.empty()) headers.emplace("X-Tenant-ID", tenant);
    return client_.Get(("/v1/shipments/" + id).c_str(), headers);
  }

  ScratchDatabase db_;
  Running svc_;
  httplib::Client client_;
};

TEST_F(ShippingTest, CreatesOneShipmentPerKeyHoweverOftenTheRequestIsRetried) {
  Call call{.key = "A-shipping", .body = kShipment};
  auto first = Post(client_, "/v1/shipments", call);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_FALSE(first->has_header("Idempotent-Replayed"));
  auto body = nlohmann::json::parse(first->body);
  const auto id = body["shipment_id"].get<std::string>();
  EXPECT_EQ(id.rfind("shp_", 0), 0u);
  EXPECT_EQ(id.size(), 4u + 32u);
  EXPECT_EQ(body["status"], "created");
  EXPECT_EQ(body["reservation_id"], kReservation);
  EXPECT_EQ(body["country"], "GB");
  EXPECT_EQ(first->get_header_value("Location"), "/v1/shipments/" + id);

  // Retries one after another, the same request written differently among them.
  for (const char* retry_body : {kShipment, kShipmentReordered, kShipment}) {
    auto replay = Post(client_, "/v1/shipments", {.key = "A-shipping", .body = retry_body});
    ASSERT_TRUE(replay);
    EXPECT_EQ(replay->status, 201);
    EXPECT_EQ(replay->body, first->body);
    EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
    EXPECT_EQ(replay->get_header_value("Location"), "/v1/shipments/" + id);
    EXPECT_EQ(replay->get_header_value("Content-Type"), "application/json");
  }
  // And a storm of concurrent duplicates: each is answered with the first answer.
  constexpr int kDuplicates = 8;
  std::vector<std::string> answers(kDuplicates);
  std::vector<int> statuses(kDuplicates);
  std::vector<std::thread> threads;
  for (int i = 0; i < kDuplicates; ++i) {
    threads.emplace_back([&, i] {
      auto c = svc_.Client();
      auto r = Post(c, "/v1/shipments", call);
      if (r) {
        statuses[i] = r->status;
        answers[i] = r->body;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kDuplicates; ++i) {
    EXPECT_EQ(statuses[i], 201) << answers[i];
    EXPECT_EQ(answers[i], first->body);
  }

  EXPECT_EQ(Shipments(), 1);
  EXPECT_EQ(Keys(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM shipments WHERE shipment_id = $1 AND tenant_id = "
                      "'demo' AND idempotency_key = 'A-shipping' AND reservation_id = $2 AND "
                      "address->>'postal_code' = 'SW1Y 4JH' AND cancelled_at IS NULL",
                      id, std::string(kReservation)),
            1);
}

TEST_F(ShippingTest, TheSameKeyWithAnotherBodyIsRefusedAsReusedAndChangesNothing) {
  auto first = Post(client_, "/v1/shipments", {.key = "B-shipping", .body = kShipment});
  ASSERT_EQ(first->status, 201);
  auto other = nlohmann::json::parse(kShipment);
  other["address"]["city"] = "Paris";
  other["address"]["country"] = "FR";
  auto reused = Post(client_, "/v1/shipments", {.key = "B-shipping", .body = other.dump()});
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(ErrorCode(reused), "idempotency_key_reused");
  EXPECT_FALSE(reused->has_header("Idempotent-Replayed"));
  EXPECT_EQ(Shipments(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM shipments WHERE address->>'country' = 'GB'"), 1);
  // The original request still replays its answer.
  EXPECT_EQ(Post(client_, "/v1/shipments", {.key = "B-shipping", .body = kShipment})->body,
            first->body);
}

TEST_F(ShippingTest, TheSameKeyInTwoTenantsShipsTwice) {
  Call demo{.key = "T-shipping", .body = kShipment};
  Call acme = demo;
  acme.tenant = "acme";
  auto a = Post(client_, "/v1/shipments", demo);
  auto b = Post(client_, "/v1/shipments", acme);
  EXPECT_EQ(a->status, 201);
  EXPECT_EQ(b->status, 201);
  EXPECT_FALSE(b->has_header("Idempotent-Replayed"));
  EXPECT_NE(a->body, b->body);
  EXPECT_EQ(Shipments(), 2);
}

TEST_F(ShippingTest, AnUnserviceableCountryIsRefusedStoredReplayedAndShipsNothing) {
  Call call{.key = "C-shipping", .body = kUnserviceable};
  auto refused = Post(client_, "/v1/shipments", call);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 422);
  EXPECT_EQ(ErrorCode(refused), "address_unserviceable");
  EXPECT_FALSE(refused->has_header("Idempotent-Replayed"));
  auto again = Post(client_, "/v1/shipments", call);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 422);
  EXPECT_EQ(again->body, refused->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Shipments(), 0);
  // Stored: the key holds the refusal, so a retry never ships to another answer.
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                      "'C-shipping' AND status = 'completed' AND response_status = 422"),
            1);
  // Its compensation finds nothing to undo.
  auto cancel = Post(client_, "/v1/shipments/cancel",
                     {.key = "C-shipping-compensate", .body = R"({"action_key":"C-shipping"})"});
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 200);
  EXPECT_EQ(nlohmann::json::parse(cancel->body)["outcome"], "nothing_to_undo");
  EXPECT_EQ(Shipments(), 0);
}

TEST_F(ShippingTest, EveryBadShipmentIsRefusedNamingItsFieldAndStoresNothing) {
  auto with = [](const std::function<void(nlohmann::json&)>& change) {
    auto body = nlohmann::json::parse(kShipment);
    change(body);
    return body.dump();
  };
  struct Case {
    const char* name;
    std::string body;
    const char* field;  // the message must name it
  };
  const std::vector<Case> cases = {
      {"not an object", "[]", "body"},
      {"unknown field", with([](auto& b) { b["priority"] = "express"; }), "'priority'"},
      {"unknown address field", with([](auto& b) { b["address"]["line2"] = "Flat 1"; }), "'line2'"},
      {"no reservation", with([](auto& b) { b.erase("reservation_id"); }), "reservation_id"},
      {"bad reservation", with([](auto& b) { b["reservation_id"] = "res_XYZ"; }), "reservation_id"},
      {"numeric reservation", with([](auto& b) { b["reservation_id"] = 42; }), "reservation_id"},
      {"no address", with([](auto& b) { b.erase("address"); }), "address"},
      {"address not object", with([](auto& b) { b["address"] = "London"; }), "address"},
      {"no name", with([](auto& b) { b["address"].erase("name"); }), "address.name"},
      {"empty line1", with([](auto& b) { b["address"]["line1"] = ""; }), "address.line1"},
      {"control in city", with([](auto& b) { b["address"]["city"] = "Lon\ndon"; }), "address.city"},
      {"long city", with([](auto& b) { b["address"]["city"] = std::string(201, 'x'); }),
       "address.city"},
      {"bad postal code", with([](auto& b) { b["address"]["postal_code"] = "SW1Y_4JH"; }),
       "address.postal_code"},
      {"lower-case country", with([](auto& b) { b["address"]["country"] = "gb"; }),
       "address.country"},
      {"three-letter country", with([](auto& b) { b["address"]["country"] = "GBR"; }),
       "address.country"},
      {"numeric country", with([](auto& b) { b["address"]["country"] = 44; }), "address.country"},
  };
  for (const auto& c : cases) {
    auto r = Post(client_, "/v1/shipments", {.key = "D-shipping", .body = c.body});
    ASSERT_TRUE(r) << c.name;
    EXPECT_EQ(r->status, 400) << c.name << ": " << r->body;
    EXPECT_EQ(ErrorCode(r), "invalid_request") << c.name;
    auto message = nlohmann::json::parse(r->body)["detail"].get<std::string>();
    EXPECT_NE(message.find(c.field), std::string::npos) << c.name << ": " << message;
  }
  EXPECT_EQ(Keys(), 0);
  EXPECT_EQ(Shipments(), 0);
  // Refusals stored nothing: the key is still free for a good request.
  EXPECT_EQ(Post(client_, "/v1/shipments", {.key = "D-shipping", .body = kShipment})->status, 201);
  // UTF-8 text is an address like any other.
  auto accented = with([](auto& b) { b["address"]["city"] = "Zürich"; });
  EXPECT_EQ(Post(client_, "/v1/shipments", {.key = "E-shipping", .body = accented})->status, 201);
}

TEST_F(ShippingTest, CancelMarksTheShipmentCancelledExactlyOnce) {
  auto created = Post(client_, "/v1/shipments", {.key = "F-shipping", .body = kShipment});
  ASSERT_EQ(created->status, 201);
  auto id = nlohmann::json::parse(created->body)["shipment_id"].get<std::string>();

  Call cancel{.key = "F-shipping-compensate", .body = R"({"action_key":"F-shipping"})"};
  auto first = Post(client_, "/v1/shipments/cancel", cancel);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200);
  auto answer = nlohmann::json::parse(first->body);
  EXPECT_EQ(answer["outcome"], "undone");
  EXPECT_EQ(answer["cancelled"], true);
  EXPECT_EQ(answer["shipment_id"], id);
  auto cancelled_at = [&] {
    return db_.Count("SELECT (extract(epoch FROM cancelled_at) * 1000000)::bigint FROM shipments");
  };
  const long long at = cancelled_at();

  // Retries of the cancel under its own key replay it.
  for (int i = 0; i < 3; ++i) {
    auto retry = Post(client_, "/v1/shipments/cancel", cancel);
    ASSERT_TRUE(retry);
    EXPECT_EQ(retry->status, 200);
    EXPECT_EQ(retry->body, first->body);
    EXPECT_EQ(retry->get_header_value("Idempotent-Replayed"), "true");
  }
  // A second compensation under another key finds it undone and undoes nothing.
  auto other = Post(client_, "/v1/shipments/cancel",
                    {.key = "F-shipping-compensate-2", .body = R"({"action_key":"F-shipping"})"});
  EXPECT_EQ(nlohmann::json::parse(other->body)["outcome"], "already_undone");
  EXPECT_FALSE(nlohmann::json::parse(other->body).contains("cancelled"));

  EXPECT_EQ(Shipments(), 1);
  EXPECT_EQ(Shipments("cancelled"), 1);
  EXPECT_EQ(cancelled_at(), at);  // set once, never moved by a retry
  auto read = Get(id);
  ASSERT_TRUE(read);
  EXPECT_EQ(nlohmann::json::parse(read->body)["status"], "cancelled");
  // The action is no longer in effect: its success is not replayed again.
  auto late_retry = Post(client_, "/v1/shipments", {.key = "F-shipping", .body = kShipment});
  EXPECT_EQ(late_retry->status, 409);
  EXPECT_EQ(ErrorCode(late_retry), "compensated");
  EXPECT_EQ(Shipments(), 1);
}

TEST_F(ShippingTest, ACancelBeforeItsShipmentLeavesATombstoneAndTheLateShipmentIsRefused) {
  Call cancel{.key = "G-shipping-compensate", .body = R"({"action_key":"G-shipping"})"};
  auto early = Post(client_, "/v1/shipments/cancel", cancel);
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 200);
  EXPECT_EQ(nlohmann::json::parse(early->body)["outcome"], "cancelled");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                      "'G-shipping' AND status = 'tombstone'"),
            1);

  for (int i = 0; i < 2; ++i) {
    auto late = Post(client_, "/v1/shipments", {.key = "G-shipping", .body = kShipment});
    ASSERT_TRUE(late);
    EXPECT_EQ(late->status, 409);
    EXPECT_EQ(ErrorCode(late), "cancelled");
  }
  EXPECT_EQ(Shipments(), 0);
  auto again = Post(client_, "/v1/shipments/cancel", cancel);
  EXPECT_EQ(again->body, early->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
}

TEST_F(ShippingTest, AShipmentIsReadOnlyByItsTenantWithTheServiceToken) {
  auto created = Post(client_, "/v1/shipments", {.key = "H-shipping", .body = kShipment});
  ASSERT_EQ(created->status, 201);
  auto id = nlohmann::json::parse(created->body)["shipment_id"].get<std::string>();

  auto read = Get(id);
  ASSERT_TRUE(read);
  EXPECT_EQ(read->status, 200);
  EXPECT_EQ(nlohmann::json::parse(read->body), nlohmann::json({{"shipment_id", id},
                                                               {"status", "created"},
                                                               {"reservation_id", kReservation},
                                                               {"country", "GB"}}));

  EXPECT_EQ(Get(id, "acme")->status, 404);  // another tenant's shipment does not exist for it
  EXPECT_EQ(ErrorCode(Get(id, "acme")), "not_found");
  EXPECT_EQ(Get("shp_" + std::string(32, '0'))->status, 404);
  EXPECT_EQ(Get(id, "")->status, 401);
  EXPECT_EQ(Get(id, "a b")->status, 401);
  EXPECT_EQ(client_.Get(("/v1/shipments/" + id).c_str(), {{"X-Tenant-ID", "demo"}})->status, 401);
}

}  // namespace
