// The whole flow over real HTTP: the orchestrator and both participants on port 0, each with
// its own real PostgreSQL database. Invariants are counted in the participants' tables.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <set>

#include "common/crypto.hpp"
#include "orchestrator/orchestrator.hpp"
#include "services_mock/participant.hpp"
#include "services_mock/service.hpp"
#include "steps/place_order.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using orchestrator::Orchestrator;
using orchestrator::OrchestratorOptions;
using services_mock::ParticipantKind;
using services_mock::ParticipantService;
using test_support::Call;
using test_support::ErrorCode;
using test_support::kDeclinedOrder;
using test_support::kOrder;
using test_support::Order;
using test_support::Post;
using test_support::ScratchDatabase;
using test_support::Serving;

constexpr const char* kGadgetOrder =
    R"({"customer_id":"cust_1","items":[{"sku":"gadget","quantity":11}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_visa"})";

// Fast retries so that failure paths finish in milliseconds.
OrchestratorOptions TestOptions(const std::string& db, const std::string& inventory,
                                const std::string& payment) {
  OrchestratorOptions o;
  o.database_url = db;
  o.inventory_url = inventory;
  o.payment_url = payment;
  o.retry = {.max_attempts = 4,
             .initial_backoff = std::chrono::milliseconds(5),
             .max_backoff = std::chrono::milliseconds(40),
             .step_deadline = std::chrono::milliseconds(4000)};
  o.sagas.threads = 16;
  return o;
}

class OrdersTest : public ::testing::Test {
 protected:
  OrdersTest()
      : orch_db_("orchestrator"),
        inv_db_("inventory"),
        pay_db_("payment"),
        inventory_(ParticipantKind::kInventory, inv_db_.url(), services_mock::ParticipantOptions{}),
        payment_(ParticipantKind::kPayment, pay_db_.url(), services_mock::ParticipantOptions{}) {}

  void SetUp() override { Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url())); }

  void Start(OrchestratorOptions options, orchestrator::DefinitionFactory factory = {}) {
    orch_.reset();
    orch_ = std::make_unique<Serving<Orchestrator>>(std::move(options), std::move(factory));
    orch_->service.store().UpsertTenant("demo", common::Sha256Hex("dev-key-demo"));
    orch_->service.store().UpsertTenant("acme", common::Sha256Hex("dev-key-acme"));
    client_ = std::make_unique<httplib::Client>(orch_->Client());
  }

  httplib::Result Submit(const Call& call) { return Post(*client_, "/v1/orders", call); }
  httplib::Result Get(const std::string& key, const std::string& api_key = "dev-key-demo") {
    return client_->Get(("/v1/orders/" + key).c_str(), {{"Authorization", "Bearer " + api_key}});
  }

  long long Reservations(const std::string& status = "") {
    return status.empty()
               ? inv_db_.Count("SELECT count(*) FROM reservations")
               : inv_db_.Count("SELECT count(*) FROM reservations WHERE status = $1", status);
  }
  long long Charges(const std::string& status = "") {
    return status.empty() ? pay_db_.Count("SELECT count(*) FROM charges")
                          : pay_db_.Count("SELECT count(*) FROM charges WHERE status = $1", status);
  }
  long long Available(const std::string& sku) {
    return inv_db_.Count("SELECT available FROM stock WHERE sku = $1", sku);
  }
  long long ParentKeys() { return orch_db_.Count("SELECT count(*) FROM idempotency_keys"); }

  ScratchDatabase orch_db_, inv_db_, pay_db_;
  Serving<ParticipantService> inventory_, payment_;
  std::unique_ptr<Serving<Orchestrator>> orch_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(OrdersTest, ASuccessfulOrderReservesAndChargesOnceAndAnswers201) {
  auto r = Submit(Order("order-1"));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["status"], "completed");
  EXPECT_EQ(body["idempotency_key"], "order-1");
  EXPECT_EQ(body["order_id"].get<std::string>().rfind("ord_", 0), 0u);
  EXPECT_EQ(body["reservation_id"].get<std::string>().rfind("res_", 0), 0u);
  EXPECT_EQ(body["charge_id"].get<std::string>().rfind("ch_", 0), 0u);
  EXPECT_EQ(body["trace_id"].get<std::string>().size(), 32u);
  EXPECT_EQ(Reservations("reserved"), 1);
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  // The participants saw the derived keys, scoped to the tenant.
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM reservations WHERE tenant_id = 'demo' AND "
                          "idempotency_key = 'order-1-inventory'"),
            1);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges WHERE tenant_id = 'demo' AND "
                          "idempotency_key = 'order-1-payment'"),
            1);

  auto saga = Get("order-1");
  ASSERT_EQ(saga->status, 200);
  auto view = nlohmann::json::parse(saga->body);
  EXPECT_EQ(view["status"], "completed");
  EXPECT_EQ(view["steps"][0]["derived_key"], "order-1-inventory");
  EXPECT_EQ(view["steps"][1]["status"], "succeeded");
  EXPECT_EQ(view["response"]["status"], 201);
}

TEST_F(OrdersTest, ARetryReplaysTheStoredResponseByteForByteAndDoesNothingElse) {
  auto first = Submit(Order("order-2"));
  auto again = Submit(Order("order-2"));
  ASSERT_TRUE(first && again);
  EXPECT_EQ(again->status, first->status);
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_FALSE(first->has_header("Idempotent-Replayed"));
  EXPECT_EQ(Reservations(), 1);
  EXPECT_EQ(Charges(), 1);
  // The quoted sf-string form is the same key.
  auto quoted = Submit(Order("\"order-2\""));
  EXPECT_EQ(quoted->body, first->body);
}

TEST_F(OrdersTest, ADeclinedPaymentReleasesTheStockExactlyOnceAndChargesNothing) {
  auto r = Submit(Order("order-3", kDeclinedOrder));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 402);
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["status"], "failed");
  EXPECT_EQ(body["error"]["code"], "card_declined");
  EXPECT_EQ(body["compensated"], nlohmann::json::array({"inventory"}));
  EXPECT_EQ(Charges(), 0);
  EXPECT_EQ(Reservations("released"), 1);
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(inv_db_.Count("SELECT reserved FROM stock WHERE sku = 'widget'"), 0);
  // A retry replays the failure and releases nothing twice.
  auto again = Submit(Order("order-3", kDeclinedOrder));
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(Get("order-3")->status, 200);
  EXPECT_EQ(nlohmann::json::parse(Get("order-3")->body)["steps"][0]["status"], "compensated");
}

TEST_F(OrdersTest, AnOutOfStockOrderChargesNothing) {
  auto r = Submit(Order("order-4", kGadgetOrder));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["code"], "insufficient_stock");
  EXPECT_EQ(nlohmann::json::parse(r->body)["compensated"], nlohmann::json::array());
  EXPECT_EQ(Charges(), 0);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);  // never called
  EXPECT_EQ(Available("gadget"), 10);
}

TEST_F(OrdersTest, AHundredConcurrentIdenticalPostsMakeOneChargeAndOneReservation) {
  constexpr int kClients = 100;
  std::vector<std::pair<int, std::string>> answers(kClients);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto client = orch_->Client();
      while (!go) std::this_thread::yield();
      auto r = Post(client, "/v1/orders", Order("storm"));
      answers[i] = r ? std::pair{r->status, r->body} : std::pair{0, std::string()};
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  std::set<std::string> success_bodies;
  std::map<int, int> by_status;
  for (const auto& [status, body] : answers) {
    ++by_status[status];
    if (status / 100 == 2) success_bodies.insert(body);
  }
  EXPECT_EQ(Reservations(), 1);
  EXPECT_EQ(Charges(), 1);
  EXPECT_EQ(success_bodies.size(), 1u);
  EXPECT_EQ(by_status[201], kClients - by_status[409]) << "only 201 and 409 are expected";
  // Once it has finished, every retry gets those same bytes.
  EXPECT_EQ(Submit(Order("storm"))->body, *success_bodies.begin());
}

TEST_F(OrdersTest, TenantsNeverSeeEachOthersOrders) {
  auto demo = Submit(Order("shared-key"));
  auto acme = Submit(Order("shared-key", kOrder, "dev-key-acme"));
  ASSERT_EQ(demo->status, 201);
  ASSERT_EQ(acme->status, 201);
  EXPECT_FALSE(acme->has_header("Idempotent-Replayed"));
  EXPECT_NE(nlohmann::json::parse(acme->body)["order_id"],
            nlohmann::json::parse(demo->body)["order_id"]);
  EXPECT_EQ(Charges(), 2);
  Submit(Order("demo-only"));
  EXPECT_EQ(Get("demo-only", "dev-key-acme")->status, 404);
  EXPECT_EQ(Get("demo-only", "dev-key-demo")->status, 200);
  EXPECT_EQ(nlohmann::json::parse(Get("shared-key", "dev-key-acme")->body)["order_id"],
            nlohmann::json::parse(acme->body)["order_id"]);
}

TEST_F(OrdersTest, EveryBadRequestGetsItsClearErrorAndStoresNothing) {
  struct Case {
    const char* name;
    Call call;
    int status;
    const char* code;
  };
  auto with = [](std::function<void(nlohmann::json&)> edit) {
    auto j = nlohmann::json::parse(kOrder);
    edit(j);
    return j.dump();
  };
  std::vector<Case> cases = {
      {"no api key", Order("k", kOrder, ""), 401, "unauthorized"},
      {"wrong api key", Order("k", kOrder, "dev-key-nobody"), 401, "unauthorized"},
      {"service token is not an api key", Order("k", kOrder, "dev-service-token"), 401,
       "unauthorized"},
      {"no key", Order("", kOrder), 400, "idempotency_key_missing"},
      {"key too long", Order(std::string(201, 'k')), 400, "idempotency_key_invalid"},
      {"empty quoted key", Order("\"\""), 400, "idempotency_key_invalid"},
      {"bad json", Order("k", "{"), 400, "invalid_json"},
      {"deep json", Order("k", std::string(50, '[') + std::string(50, ']')), 400, "invalid_json"},
      {"no items", Order("k", with([](auto& j) { j.erase("items"); })), 400, "invalid_request"},
      {"zero quantity", Order("k", with([](auto& j) { j["items"][0]["quantity"] = 0; })), 400,
       "invalid_request"},
      {"string amount", Order("k", with([](auto& j) { j["amount_cents"] = "25"; })), 400,
       "invalid_request"},
      {"negative amount", Order("k", with([](auto& j) { j["amount_cents"] = -1; })), 400,
       "invalid_request"},
      {"absurd amount", Order("k", with([](auto& j) { j["amount_cents"] = 1e15; })), 400,
       "invalid_request"},
      {"bad currency", Order("k", with([](auto& j) { j["currency"] = "dollars"; })), 400,
       "invalid_request"},
      {"unknown field", Order("k", with([](auto& j) { j["coupon"] = "FREE"; })), 400,
       "invalid_request"},
      {"text body",
       [] {
         auto c = Order("k");
         c.content_type = "text/plain";
         return c;
       }(),
       415, "unsupported_media_type"},
      {"gzip",
       [] {
         auto c = Order("k");
         c.extra = {{"Content-Encoding", "gzip"}};
         return c;
       }(),
       415, "unsupported_content_encoding"},
      {"too large", Order("k", std::string(65 * 1024, ' ') + kOrder), 413, "payload_too_large"},
  };
  for (const auto& c : cases) {
    auto r = Submit(c.call);
    ASSERT_TRUE(r) << c.name;
    EXPECT_EQ(r->status, c.status) << c.name << ": " << r->body;
    EXPECT_EQ(ErrorCode(r), c.code) << c.name;
  }
  auto invalid = Submit(Order("k", with([](auto& j) { j["items"][0]["quantity"] = 0; })));
  EXPECT_NE(nlohmann::json::parse(invalid->body)["error"]["message"].get<std::string>().find(
                "items[0].quantity"),
            std::string::npos);
  EXPECT_EQ(ParentKeys(), 0);
  EXPECT_EQ(Reservations(), 0);
  EXPECT_EQ(Charges(), 0);
}

TEST_F(OrdersTest, TheSameKeyWithAnotherBodyIs422AndChangesNothing) {
  auto first = Submit(Order("order-5"));
  auto other = Submit(Order("order-5", kDeclinedOrder));
  EXPECT_EQ(other->status, 422);
  EXPECT_EQ(ErrorCode(other), "idempotency_key_reused");
  EXPECT_EQ(Charges(), 1);
  EXPECT_EQ(Submit(Order("order-5"))->body, first->body);
}

TEST_F(OrdersTest, ASagaOutlivingTheResponseBudgetAnswers202ThenTheFinalResponse) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = std::chrono::milliseconds(200);
  Start(options);
  payment_.service.faults().Set({.latency_ms = 1200});
  auto accepted = Submit(Order("slow"));
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 202);
  EXPECT_EQ(accepted->get_header_value("Location"), "/v1/orders/slow");
  auto busy = Submit(Order("slow"));
  EXPECT_EQ(busy->status, 409);
  EXPECT_EQ(ErrorCode(busy), "idempotency_key_in_progress");
  EXPECT_TRUE(busy->has_header("Retry-After"));
  // Poll the saga (bounded), as a client following Location would.
  std::string status;
  for (int i = 0; i < 100 && status != "completed"; ++i) {
    status = nlohmann::json::parse(Get("slow")->body)["status"];
    if (status != "completed") std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, "completed");
  auto final = Submit(Order("slow"));
  EXPECT_EQ(final->status, 201);
  EXPECT_EQ(final->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Charges(), 1);
}

TEST_F(OrdersTest, AParticipantThatStaysDownFailsTheOrderAndCompensatesEveryStepThatMayHaveRun) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = std::chrono::milliseconds(300);
  options.retry.compensation_stuck_after = 3;
  options.retry.stuck_retry_interval = std::chrono::milliseconds(100);
  options.recovery.sweep_interval = std::chrono::milliseconds(50);
  Start(options);
  payment_.service.faults().Set({.error_rate = 1});
  // The charge never gets through; its refund cannot either, so the saga stays running.
  auto accepted = Submit(Order("order-6"));
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 202);
  nlohmann::json view = nlohmann::json::object();
  for (int i = 0; i < 100 && !view.value("stuck", false); ++i) {
    view = nlohmann::json::parse(Get("order-6")->body);
    if (!view.value("stuck", false)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(view.value("stuck", false)) << "a failing compensation must be visible";
  EXPECT_EQ(view["status"], "compensating");

  payment_.service.faults().Set({});  // payment heals: the compensations go through
  for (int i = 0; i < 100 && view["status"] != "failed"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    view = nlohmann::json::parse(Get("order-6")->body);
  }
  ASSERT_EQ(view["status"], "failed");
  EXPECT_FALSE(view["stuck"].get<bool>());
  auto final = Submit(Order("order-6"));
  EXPECT_EQ(final->status, 503);
  auto body = nlohmann::json::parse(final->body);
  EXPECT_EQ(body["error"]["code"], "payment_unavailable");
  EXPECT_EQ(body["compensated"], nlohmann::json::array({"payment", "inventory"}));
  EXPECT_EQ(Available("widget"), 1000000);
  // The refund found no charge and left a tombstone: a late charge is refused.
  auto payment_client = payment_.Client();
  auto late = Post(
      payment_client, "/v1/charges",
      {.key = "order-6-payment",
       .body =
           R"({"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"})"});
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(ErrorCode(late), "cancelled");
  EXPECT_EQ(Charges(), 0);
}

TEST_F(OrdersTest, TransientParticipantErrorsAreRetriedWithTheSameKey) {
  payment_.service.faults().Set({.error_rate = 0.5});
  int completed = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = Submit(Order("flaky-" + std::to_string(i)));
    completed += r && r->status == 201 ? 1 : 0;
  }
  // 4 attempts at 50% fail together about 6% of the time: most complete, none twice.
  EXPECT_GE(completed, 5);
  EXPECT_EQ(Charges("captured"), completed);
  EXPECT_EQ(Reservations("reserved"), completed);
}

TEST(OrdersWithoutDatabase, AnUnreachableDatabaseAnswers503AndTheClientMayRetry) {
  auto options = TestOptions("postgresql://postgres@127.0.0.1:1/none", "http://127.0.0.1:1",
                             "http://127.0.0.1:1");
  Serving<Orchestrator> orch(options);
  auto client = orch.Client();
  auto r = Post(client, "/v1/orders", Order("k"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(ErrorCode(r), "unavailable");
  EXPECT_EQ(client.Get("/readyz")->status, 503);
  EXPECT_EQ(client.Get("/healthz")->status, 200);
}

// A third step declared in code against a test participant built on the same guard: the
// README's "Declare your own saga" example.
TEST_F(OrdersTest, AThirdStepDeclaredInCodeRunsAndIsCompensatedInReverse) {
  ScratchDatabase ship_db("payment");  // any participant database: it has the guard's table
  ship_db.Exec("CREATE TABLE shipments (key text PRIMARY KEY, status text NOT NULL)");
  common::pg::Pool pool({.url = ship_db.url(), .size = 4});
  services_mock::Faults faults;
  services_mock::Participant shipping("shipping", pool, faults, {});
  Serving<common::http::Server> server;
  shipping.Action(
      server.service, "/v1/shipments",
      [](const nlohmann::json& b) { return b.contains("address") ? "" : "address is required"; },
      [](pqxx::work& tx, const steps::guard::Request& req) -> steps::guard::Response {
        if (req.body["address"] == "nowhere") {
          return {422, R"({"error":{"code":"undeliverable","message":"no such address"}})"};
        }
        tx.exec_params("INSERT INTO shipments VALUES ($1, 'booked')", req.key);
        return {201, nlohmann::json{{"shipment_id", "shp_" + req.key}}.dump()};
      });
  shipping.Compensation(
      server.service, "/v1/shipments/cancel",
      [](pqxx::work& tx, const steps::guard::Request&, const steps::guard::ActionRecord& action) {
        tx.exec_params("UPDATE shipments SET status = 'cancelled' WHERE key = $1", action.key);
        return nlohmann::json::object();
      });
  steps::client::ParticipantClient ship_client({.base_url = server.Url()});

  // --- the saga, as a user would declare it ---
  auto factory = [&](steps::client::ParticipantClient& inventory,
                     steps::client::ParticipantClient& payment) {
    return steps::MakePlaceOrderSaga(inventory, payment)
        .Step(
            "shipping",
            [&](saga::StepContext& ctx) {
              return ship_client.Post(
                  "/v1/shipments", ctx,
                  {{"address",
                    (*ctx.request)["customer_id"] == "cust_far" ? "nowhere" : "1 Main St"}});
            },
            [&](saga::StepContext& ctx) {
              return ship_client.Post("/v1/shipments/cancel", ctx,
                                      {{"action_key", ctx.action_key}});
            });
  };
  Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url()), factory);

  auto ok = Submit(Order("ship-1"));
  ASSERT_EQ(ok->status, 201) << ok->body;
  EXPECT_EQ(nlohmann::json::parse(ok->body)["shipment_id"], "shp_ship-1-shipping");
  EXPECT_EQ(ship_db.Count("SELECT count(*) FROM shipments WHERE status = 'booked'"), 1);

  auto far = nlohmann::json::parse(kOrder);
  far["customer_id"] = "cust_far";
  auto refused = Submit(Order("ship-2", far.dump()));
  EXPECT_EQ(refused->status, 422);
  EXPECT_EQ(nlohmann::json::parse(refused->body)["compensated"],
            nlohmann::json::array({"payment", "inventory"}));
  EXPECT_EQ(Charges("refunded"), 1);
  EXPECT_EQ(Reservations("released"), 1);
}

}  // namespace
