// The demo participants over real HTTP (servers on port 0) against real PostgreSQL.
#include <gtest/gtest.h>
#include <httplib.h>

#include <optional>
#include <set>
#include <thread>

#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "tests/support/metrics_text.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using test_support::ScratchDatabase;

constexpr const char* kToken = idemsaga::demo::kServiceToken;
using Running = test_support::Serving<ParticipantService>;
using test_support::Call;
using test_support::ErrorCode;
using test_support::Post;
using test_support::PromtoolProblems;
using test_support::Sample;

class InventoryTest : public ::testing::Test {
 protected:
  InventoryTest()
      : db_("inventory"),
        svc_(ParticipantKind::kInventory, db_.url(),
             idemsaga::demo::ParticipantOptions{.pool_size = 8}),
        client_(svc_.Client()) {}
  long long Available(const std::string& sku) {
    return db_.Count("SELECT available FROM stock WHERE sku = $1", sku);
  }
  long long Rows(const std::string& table) { return db_.Count("SELECT count(*) FROM " + table); }
  ScratchDatabase db_;
  Running svc_;
  httplib::Client client_;
};

TEST_F(InventoryTest, ReservesStockAndReplaysTheSameReservation) {
  auto first = Post(client_, "/v1/reservations",
                    {.key = "A-inventory", .body = R"({"items":[{"sku":"widget","quantity":2}]})"});
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 201);
  auto body = nlohmann::json::parse(first->body);
  EXPECT_EQ(body["reservation_id"].get<std::string>().rfind("res_", 0), 0u);
  EXPECT_EQ(Available("widget"), 1000000 - 2);

  auto replay =
      Post(client_, "/v1/reservations",
           {.key = "A-inventory", .body = R"({ "items" : [ {"quantity":2, "sku":"widget"} ] })"});
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 201);
  EXPECT_EQ(replay->body, first->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  EXPECT_EQ(Rows("reservations"), 1);
}

// One SKU takes its slot, records the reservation and stores its key in one statement: what it
// records is what a release needs to put every unit back where it came from.
TEST_F(InventoryTest, AOneSkuReservationRecordsItsSlotAndIsReleasedIntoIt) {
  auto r = Post(client_, "/v1/reservations",
                {.key = "O-inventory", .body = R"({"items":[{"sku":"widget","quantity":4}]})"});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(nlohmann::json::parse(r->body)["items"],
            nlohmann::json::parse(R"([{"quantity":4,"sku":"widget"}])"));
  EXPECT_EQ(db_.Count(R"(SELECT count(*) FROM reservations r JOIN stock_slots s
                         ON s.sku = 'widget' AND s.slot = (r.slots->0->>'slot')::int
                         WHERE r.idempotency_key = 'O-inventory' AND r.reservation_id = $1
                           AND r.items = '[{"sku":"widget","quantity":4}]'::jsonb
                           AND jsonb_array_length(r.slots) = 1
                           AND r.slots->0->>'sku' = 'widget'
                           AND (r.slots->0->>'quantity')::int = 4 AND s.reserved = 4)",
                      // the answer, planned before the statement ran, names what it recorded
                      nlohmann::json::parse(r->body)["reservation_id"].get<std::string>()),
            1);
  auto released =
      Post(client_, "/v1/reservations/release",
           {.key = "O-inventory-compensate", .body = R"({"action_key":"O-inventory"})"});
  ASSERT_TRUE(released);
  EXPECT_EQ(released->status, 200) << released->body;
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM stock_slots WHERE reserved <> 0"), 0);
}

// Duplicates of one key at once, through the planned statement: each may find the key free
// and take a different free slot, and all but one trip on a unique index and give theirs
// back. One reservation, the stock down once, one answer.
TEST_F(InventoryTest, SixteenConcurrentDuplicatesReserveOnceAndShareOneAnswer) {
  constexpr int kDuplicates = 16;
  std::vector<std::optional<httplib::Result>> answers(kDuplicates);
  std::vector<std::thread> threads;
  for (int i = 0; i < kDuplicates; ++i) {
    threads.emplace_back([&, i] {
      auto client = svc_.Client();
      answers[i] =
          Post(client, "/v1/reservations",
               {.key = "Z-inventory", .body = R"({"items":[{"sku":"widget","quantity":3}]})"});
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> bodies;
  for (auto& a : answers) {
    ASSERT_TRUE(a && *a);
    ASSERT_EQ((*a)->status, 201) << (*a)->body;
    bodies.insert((*a)->body);
  }
  EXPECT_EQ(bodies.size(), 1u);
  EXPECT_EQ(Rows("reservations"), 1);
  EXPECT_EQ(Available("widget"), 1000000 - 3);
  EXPECT_EQ(db_.Count("SELECT sum(reserved) FROM stock_slots WHERE sku = 'widget'"), 3);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM reservations WHERE reservation_id = $1",
                      nlohmann::json::parse(*bodies.begin())["reservation_id"].get<std::string>()),
            1);
}

TEST_F(InventoryTest, InsufficientStockIsStoredAndChangesNothing) {
  auto r =
      Post(client_, "/v1/reservations",
           {.key = "B-inventory",
            .body = R"({"items":[{"sku":"widget","quantity":1},{"sku":"gadget","quantity":11}]})"});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(ErrorCode(r), "insufficient_stock");
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(Available("gadget"), 10);
  EXPECT_EQ(Rows("reservations"), 0);
  auto again =
      Post(client_, "/v1/reservations",
           {.key = "B-inventory",
            .body = R"({"items":[{"sku":"widget","quantity":1},{"sku":"gadget","quantity":11}]})"});
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
}

TEST_F(InventoryTest, UnknownSkuIsInsufficientStock) {
  auto r = Post(client_, "/v1/reservations",
                {.key = "U-inventory", .body = R"({"items":[{"sku":"unicorn","quantity":1}]})"});
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(ErrorCode(r), "insufficient_stock");
}

TEST_F(InventoryTest, ReleaseTwiceRestoresStockExactlyOnce) {
  Post(client_, "/v1/reservations",
       {.key = "C-inventory", .body = R"({"items":[{"sku":"gadget","quantity":3}]})"});
  EXPECT_EQ(Available("gadget"), 7);
  Call release{.key = "C-inventory-compensate", .body = R"({"action_key":"C-inventory"})"};
  auto first = Post(client_, "/v1/reservations/release", release);
  auto second = Post(client_, "/v1/reservations/release", release);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(nlohmann::json::parse(first->body)["outcome"], "undone");
  EXPECT_EQ(second->body, first->body);
  EXPECT_EQ(second->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Available("gadget"), 10);
  EXPECT_EQ(db_.Count("SELECT reserved FROM stock WHERE sku = 'gadget'"), 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM reservations WHERE status = 'released'"), 1);
  // Three units from three one-unit slots, each given back where it came from.
  EXPECT_EQ(db_.Count("SELECT count(*) FROM stock_slots WHERE sku = 'gadget' AND reserved <> 0"),
            0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM stock_slots WHERE sku = 'gadget' AND available = 1"),
            10);
}

// One SKU is many slots: a reservation takes a slot nobody holds instead of queueing behind
// the reservation holding another (one row per SKU served one reservation per WAL flush).
TEST_F(InventoryTest, AReservationTakesAFreeSlotAndWaitsOnlyWhenEverySlotIsHeld) {
  pqxx::connection holder(db_.url());
  pqxx::work held(holder);
  held.exec("SELECT 1 FROM stock_slots WHERE sku = 'widget' AND slot <> 7 FOR UPDATE");
  // Answered while the other slots are still held: it never waited for them (it would have
  // waited out the lock timeout and answered 409 in progress).
  auto r = Post(client_, "/v1/reservations",
                {.key = "S-inventory", .body = R"({"items":[{"sku":"widget","quantity":5}]})"});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(db_.Count("SELECT reserved FROM stock_slots WHERE sku = 'widget' AND slot = 7"), 5);

  // Every slot held: the next one waits for them, and completes once they are free.
  held.exec("SELECT 1 FROM stock_slots WHERE sku = 'widget' AND slot = 7 FOR UPDATE");
  std::optional<httplib::Result> waited;
  std::thread waiter([&] {
    waited = Post(client_, "/v1/reservations",
                  {.key = "T-inventory", .body = R"({"items":[{"sku":"widget","quantity":5}]})"});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(Rows("reservations"), 1);
  held.abort();
  waiter.join();
  ASSERT_TRUE(waited && *waited);
  EXPECT_EQ((*waited)->status, 201);
  EXPECT_EQ(Available("widget"), 1000000 - 10);
  EXPECT_EQ(db_.Count("SELECT reserved FROM stock WHERE sku = 'widget'"), 10);
}

TEST_F(InventoryTest, AReservationArrivingAfterItsReleaseIsRefused) {
  auto release = Post(client_, "/v1/reservations/release",
                      {.key = "D-inventory-compensate", .body = R"({"action_key":"D-inventory"})"});
  EXPECT_EQ(nlohmann::json::parse(release->body)["outcome"], "cancelled");
  auto late = Post(client_, "/v1/reservations",
                   {.key = "D-inventory", .body = R"({"items":[{"sku":"gadget","quantity":1}]})"});
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(ErrorCode(late), "cancelled");
  EXPECT_EQ(Available("gadget"), 10);
  EXPECT_EQ(Rows("reservations"), 0);
}

TEST_F(InventoryTest, StockEndpointReportsAvailableAndReserved) {
  Post(client_, "/v1/reservations",
       {.key = "E-inventory", .body = R"({"items":[{"sku":"gadget","quantity":4}]})"});
  auto r = client_.Get("/v1/stock/gadget", {{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(nlohmann::json::parse(r->body),
            nlohmann::json::parse(R"({"sku":"gadget","available":6,"reserved":4})"));
  EXPECT_EQ(client_.Get("/v1/stock/gadget")->status, 401);
}

TEST_F(InventoryTest, TheSameKeyInTwoTenantsReservesTwice) {
  Call demo{.key = "A-inventory", .body = R"({"items":[{"sku":"gadget","quantity":1}]})"};
  Call acme = demo;
  acme.tenant = "acme";
  auto a = Post(client_, "/v1/reservations", demo);
  auto b = Post(client_, "/v1/reservations", acme);
  EXPECT_EQ(a->status, 201);
  EXPECT_EQ(b->status, 201);
  EXPECT_FALSE(b->has_header("Idempotent-Replayed"));
  EXPECT_NE(a->body, b->body);
  EXPECT_EQ(Available("gadget"), 8);
}

TEST_F(InventoryTest, EveryBadRequestGetsItsClearErrorAndStoresNothing) {
  const std::string ok = R"({"items":[{"sku":"widget","quantity":1}]})";
  struct Case {
    const char* name;
    Call call;
    int status;
    const char* code;
  };
  std::vector<Case> cases = {
      {"no token", {.key = "k1", .body = ok, .token = ""}, 401, "unauthorized"},
      {"wrong token", {.key = "k1", .body = ok, .token = "nope"}, 401, "unauthorized"},
      {"no tenant", {.key = "k1", .body = ok, .tenant = ""}, 401, "unauthorized"},
      {"bad tenant", {.key = "k1", .body = ok, .tenant = "a b"}, 401, "unauthorized"},
      {"no key", {.key = "", .body = ok}, 400, "idempotency_key_missing"},
      {"long key", {.key = std::string(256, 'k'), .body = ok}, 400, "idempotency_key_invalid"},
      {"bad json", {.key = "k1", .body = "{\"items\":"}, 400, "invalid_json"},
      {"not object", {.key = "k1", .body = "[]"}, 400, "invalid_request"},
      {"no items", {.key = "k1", .body = "{}"}, 400, "invalid_request"},
      {"empty items", {.key = "k1", .body = R"({"items":[]})"}, 400, "invalid_request"},
      {"unknown field",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":1}],"x":1})"},
       400,
       "invalid_request"},
      {"string quantity",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":"1"}]})"},
       400,
       "invalid_request"},
      {"negative quantity",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":-1}]})"},
       400,
       "invalid_request"},
      {"zero quantity",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":0}]})"},
       400,
       "invalid_request"},
      {"absurd quantity",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":1e12}]})"},
       400,
       "invalid_request"},
      {"huge integer",
       {.key = "k1", .body = R"({"items":[{"sku":"widget","quantity":99999999999999999999}]})"},
       400,
       "invalid_request"},
      {"bad sku",
       {.key = "k1", .body = R"({"items":[{"sku":"WIDGET!","quantity":1}]})"},
       400,
       "invalid_request"},
      {"deep json",
       {.key = "k1", .body = std::string(40, '[') + std::string(40, ']')},
       400,
       "invalid_json"},
      {"wrong content type",
       {.key = "k1", .body = ok, .content_type = "text/plain"},
       415,
       "unsupported_media_type"},
      {"gzip",
       {.key = "k1", .body = ok, .extra = {{"Content-Encoding", "gzip"}}},
       415,
       "unsupported_content_encoding"},
      {"too large",
       {.key = "k1", .body = std::string(70 * 1024, ' ') + ok},
       413,
       "payload_too_large"},
  };
  for (const auto& c : cases) {
    auto r = Post(client_, "/v1/reservations", c.call);
    ASSERT_TRUE(r) << c.name << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, c.status) << c.name << ": " << r->body;
    EXPECT_EQ(ErrorCode(r), c.code) << c.name;
  }
  auto bad_release =
      Post(client_, "/v1/reservations/release", {.key = "k2", .body = R"({"action_key":"k2"})"});
  EXPECT_EQ(bad_release->status, 400);
  EXPECT_EQ(Rows("idempotency_keys"), 0);
  EXPECT_EQ(Rows("reservations"), 0);
  EXPECT_EQ(Available("widget"), 1000000);
}

TEST_F(InventoryTest, CommitThenDropLeavesTheClientInDoubtAndTheRetryReplays) {
  svc_.service.faults().Set({.drop_after_commit_rate = 1});
  Call call{.key = "F-inventory", .body = R"({"items":[{"sku":"gadget","quantity":2}]})"};
  auto dropped = Post(client_, "/v1/reservations", call);
  EXPECT_TRUE(!dropped || dropped->status >= 500) << "the client must not see a success";
  EXPECT_EQ(Rows("reservations"), 1);  // committed before the drop
  svc_.service.faults().Set({});
  auto retry = Post(client_, "/v1/reservations", call);
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ(retry->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Rows("reservations"), 1);
  EXPECT_EQ(Available("gadget"), 8);
}

TEST_F(InventoryTest, AnInjected5xxStoresNothingAndFaultsAreSetOverHttp) {
  httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kToken}};
  auto set = client_.Put("/admin/faults", auth, R"({"error_rate":1})", "application/json");
  ASSERT_TRUE(set);
  EXPECT_EQ(set->status, 200);
  EXPECT_EQ(client_.Put("/admin/faults", R"({"error_rate":1})", "application/json")->status, 401);
  EXPECT_EQ(client_.Put("/admin/faults", auth, R"({"error_rate":2})", "application/json")->status,
            400);
  Call call{.key = "G-inventory", .body = R"({"items":[{"sku":"gadget","quantity":1}]})"};
  auto failed = Post(client_, "/v1/reservations", call);
  EXPECT_EQ(failed->status, 503);
  EXPECT_EQ(Rows("idempotency_keys"), 0);
  client_.Put("/admin/faults", auth, "{}", "application/json");
  EXPECT_EQ(Post(client_, "/v1/reservations", call)->status, 201);
  EXPECT_EQ(Available("gadget"), 9);
}

TEST_F(InventoryTest, AFaultWithAKeyPrefixFailsOnlyThoseKeysWithItsRetryAfter) {
  httplib::Headers auth = {{"Authorization", std::string("Bearer ") + kToken}};
  auto set = client_.Put("/admin/faults", auth,
                         R"({"error_rate":1,"retry_after_s":30,"key_prefix":"outage-"})",
                         "application/json");
  ASSERT_TRUE(set);
  EXPECT_EQ(set->status, 200);
  const std::string body = R"({"items":[{"sku":"gadget","quantity":1}]})";
  auto failed = Post(client_, "/v1/reservations", {.key = "outage-1-inventory", .body = body});
  EXPECT_EQ(failed->status, 503);
  EXPECT_EQ(failed->get_header_value_count("Retry-After"), 1u);
  EXPECT_EQ(failed->get_header_value("Retry-After"), "30");
  EXPECT_EQ(Post(client_, "/v1/reservations", {.key = "healthy-1-inventory", .body = body})->status,
            201);
  EXPECT_EQ(Rows("reservations"), 1);  // the healthy key's only
  EXPECT_EQ(Available("gadget"), 9);
}

TEST_F(InventoryTest, ALatencyBeyondTheClientTimeoutStillCommitsOnce) {
  svc_.service.faults().Set({.latency_ms = 1500});
  client_.set_read_timeout(0, 300 * 1000);
  Call call{.key = "H-inventory", .body = R"({"items":[{"sku":"gadget","quantity":1}]})"};
  auto timed_out = Post(client_, "/v1/reservations", call);
  EXPECT_FALSE(timed_out);
  svc_.service.faults().Set({});
  client_.set_read_timeout(5);
  auto retry = Post(client_, "/v1/reservations", call);
  EXPECT_EQ(retry->status, 201);
  EXPECT_EQ(Rows("reservations"), 1);
}

TEST_F(InventoryTest, MetricsCountWhatTheGuardDidPerOutcome) {
  const std::string body = R"({"items":[{"sku":"widget","quantity":1}]})";
  Post(client_, "/v1/reservations", {.key = "M-inventory", .body = body});
  Post(client_, "/v1/reservations", {.key = "M-inventory", .body = body});
  Post(client_, "/v1/reservations",
       {.key = "M-inventory", .body = R"({"items":[{"sku":"widget","quantity":3}]})"});
  Post(client_, "/v1/reservations", {.key = "", .body = body});  // refused before the guard
  Post(client_, "/v1/reservations/release",
       {.key = "M-inventory-compensate", .body = R"({"action_key":"M-inventory"})"});
  Post(client_, "/v1/reservations", {.key = "M-inventory", .body = body});  // undone since
  auto r = client_.Get("/metrics");
  ASSERT_EQ(r->status, 200);
  auto count = [&](const std::string& kind, const std::string& outcome) {
    return Sample(r->body, "idemsaga_guard_requests_total{service=\"inventory\",kind=\"" + kind +
                               "\",outcome=\"" + outcome + "\"}");
  };
  EXPECT_EQ(count("action", "applied"), 1) << r->body;
  EXPECT_EQ(count("action", "replayed"), 1) << r->body;
  EXPECT_EQ(count("action", "reused"), 1) << r->body;
  EXPECT_EQ(count("action", "refused"), 1) << r->body;
  EXPECT_EQ(count("action", "compensated"), 1) << r->body;
  EXPECT_EQ(count("compensation", "undone"), 1) << r->body;
  EXPECT_EQ(count("action", "in_progress"), 0) << r->body;  // shown from the start
  EXPECT_EQ(PromtoolProblems(r->body), "");
}

TEST_F(InventoryTest, ACompensationBeforeItsActionIsCountedAsATombstoneBothWays) {
  Post(client_, "/v1/reservations/release",
       {.key = "T-inventory-compensate", .body = R"({"action_key":"T-inventory"})"});
  Post(client_, "/v1/reservations",
       {.key = "T-inventory", .body = R"({"items":[{"sku":"widget","quantity":1}]})"});
  auto page = client_.Get("/metrics")->body;
  EXPECT_EQ(
      Sample(
          page,
          R"(idemsaga_guard_requests_total{service="inventory",kind="compensation",outcome="tombstoned"})"),
      1)
      << page;
  EXPECT_EQ(
      Sample(
          page,
          R"(idemsaga_guard_requests_total{service="inventory",kind="action",outcome="tombstoned"})"),
      1)
      << page;
  EXPECT_EQ(Rows("reservations"), 0);
}

// The reconciler's read: a tenant's recent keys, page by page, with the service token only.
TEST_F(InventoryTest, RecentKeysArePagedPerTenantAndNeedTheServiceToken) {
  const std::string body = R"({"items":[{"sku":"widget","quantity":1}]})";
  for (const char* key : {"K1-inventory", "K2-inventory", "K3-inventory"}) {
    ASSERT_EQ(Post(client_, "/v1/reservations", {.key = key, .body = body})->status, 201);
  }
  ASSERT_EQ(
      Post(client_, "/v1/reservations", {.key = "K9-inventory", .body = body, .tenant = "acme"})
          ->status,
      201);
  httplib::Headers auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}};
  std::vector<std::string> seen;
  std::string after;
  for (int page = 0; page < 5; ++page) {
    std::string path = "/v1/idempotency/keys?tenant=demo&since_seconds=3600&limit=2";
    if (!after.empty()) path += "&after=" + after;
    auto r = client_.Get(path.c_str(), auth);
    ASSERT_EQ(r->status, 200) << r->body;
    auto j = nlohmann::json::parse(r->body);
    for (const auto& k : j["keys"]) {
      seen.push_back(k["key"]);
      EXPECT_EQ(k["status"], "completed");
      EXPECT_EQ(k["response_status"], 201);
      EXPECT_EQ(k["compensated"], false);
    }
    if (j["next"].is_null()) break;
    after = j["next"];
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"K1-inventory", "K2-inventory", "K3-inventory"}));
  EXPECT_EQ(client_.Get("/v1/idempotency/keys?tenant=demo&since_seconds=3600")->status, 401);
  for (const char* bad :
       {"tenant=demo", "since_seconds=60", "tenant=de%20mo&since_seconds=60",
        "tenant=demo&since_seconds=0", "tenant=demo&since_seconds=-1",
        "tenant=demo&since_seconds=60&limit=1001", "tenant=demo&since_seconds=1e3"}) {
    auto r = client_.Get(("/v1/idempotency/keys?" + std::string(bad)).c_str(), auth);
    EXPECT_EQ(r->status, 400) << bad << " " << r->body;
  }
}

TEST_F(InventoryTest, HealthAndReadiness) {
  EXPECT_EQ(client_.Get("/healthz")->status, 200);
  EXPECT_EQ(client_.Get("/readyz")->status, 200);
}

class PaymentTest : public ::testing::Test {
 protected:
  PaymentTest()
      : db_("payment"),
        svc_(ParticipantKind::kPayment, db_.url(),
             idemsaga::demo::ParticipantOptions{.pool_size = 8}),
        client_(svc_.Client()) {}
  long long Charges(const std::string& status) {
    return db_.Count("SELECT count(*) FROM charges WHERE status = $1", status);
  }
  ScratchDatabase db_;
  Running svc_;
  httplib::Client client_;
};

constexpr const char* kCharge =
    R"({"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"})";
constexpr const char* kDeclined =
    R"({"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_declined"})";

TEST_F(PaymentTest, ChargesOnceAndReplays) {
  auto first = Post(client_, "/v1/charges", {.key = "A-payment", .body = kCharge});
  auto again = Post(client_, "/v1/charges", {.key = "A-payment", .body = kCharge});
  ASSERT_TRUE(first && again);
  EXPECT_EQ(first->status, 201);
  EXPECT_EQ(nlohmann::json::parse(first->body)["charge_id"].get<std::string>().rfind("ch_", 0), 0u);
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(db_.Count("SELECT sum(amount_cents) FROM charges"), 2500);
}

TEST_F(PaymentTest, ADeclineIsStoredAndChargesNothing) {
  auto declined = Post(client_, "/v1/charges", {.key = "B-payment", .body = kDeclined});
  EXPECT_EQ(declined->status, 402);
  EXPECT_EQ(ErrorCode(declined), "card_declined");
  auto again = Post(client_, "/v1/charges", {.key = "B-payment", .body = kDeclined});
  EXPECT_EQ(again->body, declined->body);
  EXPECT_EQ(again->status, 402);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM charges"), 0);
}

TEST_F(PaymentTest, RefundTwiceRefundsOnce) {
  Post(client_, "/v1/charges", {.key = "C-payment", .body = kCharge});
  Call refund{.key = "C-payment-compensate", .body = R"({"action_key":"C-payment"})"};
  auto first = Post(client_, "/v1/refunds", refund);
  auto second = Post(client_, "/v1/refunds", refund);
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(nlohmann::json::parse(first->body)["refunded"], true);
  EXPECT_EQ(second->body, first->body);
  EXPECT_EQ(Charges("refunded"), 1);
  EXPECT_EQ(Charges("captured"), 0);
}

TEST_F(PaymentTest, RefundingADeclinedChargeHasNothingToUndo) {
  Post(client_, "/v1/charges", {.key = "D-payment", .body = kDeclined});
  auto r = Post(client_, "/v1/refunds",
                {.key = "D-payment-compensate", .body = R"({"action_key":"D-payment"})"});
  EXPECT_EQ(nlohmann::json::parse(r->body)["outcome"], "nothing_to_undo");
}

TEST_F(PaymentTest, EveryBadChargeGetsItsClearErrorAndStoresNothing) {
  const std::vector<std::pair<const char*, std::string>> bodies = {
      {"missing amount", R"({"currency":"USD","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"zero amount",
       R"({"amount_cents":0,"currency":"USD","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"negative amount",
       R"({"amount_cents":-5,"currency":"USD","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"absurd amount",
       R"({"amount_cents":100000000000,"currency":"USD","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"fractional amount",
       R"({"amount_cents":25.5,"currency":"USD","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"lower currency",
       R"({"amount_cents":1,"currency":"usd","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"long currency",
       R"({"amount_cents":1,"currency":"USDX","customer_id":"c","payment_method":"pm_card_visa"})"},
      {"no customer", R"({"amount_cents":1,"currency":"USD","payment_method":"pm_card_visa"})"},
      {"bad method",
       R"({"amount_cents":1,"currency":"USD","customer_id":"c","payment_method":"Visa Card"})"},
      {"unknown field",
       R"({"amount_cents":1,"currency":"USD","customer_id":"c","payment_method":"pm_card_visa","cvv":"123"})"},
  };
  for (const auto& [name, body] : bodies) {
    auto r = Post(client_, "/v1/charges", {.key = "bad", .body = body});
    ASSERT_TRUE(r) << name;
    EXPECT_EQ(r->status, 400) << name << ": " << r->body;
    EXPECT_EQ(ErrorCode(r), "invalid_request") << name;
  }
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM charges"), 0);
}

}  // namespace
