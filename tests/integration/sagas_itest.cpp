// A saga the product does not ship, declared only here as a user would declare their own: four
// steps over inventory, payment and a participant of the test's own ("loyalty", built on the
// same guard, with its own database, on port 0), a typed input, and a last step the
// participant declines. Run over HTTP through POST /v1/runs/{saga}; its compensations must
// run in reverse and see the outputs of the steps before them, also after a kill -9 between
// two compensations (the test binary re-runs itself as the orchestrator that dies).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "cmd/idemsaga/crash_points.hpp"
#include "common/crypto.hpp"
#include "demo/guarded_routes.hpp"
#include "demo/service.hpp"
#include "orchestrator/orchestrator.hpp"
#include "steps/saga/fields.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"
#include "tests/support/wait.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using idemsaga::orchestrator::Orchestrator;
using idemsaga::orchestrator::OrchestratorOptions;
using test_support::ErrorCode;
using test_support::Order;
using test_support::Post;
using test_support::ScratchDatabase;
using test_support::Serving;
using test_support::WaitFor;
using namespace std::chrono_literals;

// --- the user's side: a participant and a saga of their own ---------------------------------

// Loyalty points for a charge, and vouchers; a voucher over 1,000 cents is a business refusal.
class Loyalty {
 public:
  explicit Loyalty(const std::string& url)
      : pool_({.url = url, .size = 4}), participant_("loyalty", pool_, faults_, {}) {
    auto& server = server_.service;
    participant_.Action(
        server, "/v1/points",
        [](const nlohmann::json& b) {
          return b.is_object() && b.size() == 2 && b.value("charge_id", "").rfind("ch_", 0) == 0 &&
                         b.contains("points") && b["points"].is_number_integer()
                     ? ""
                     : "the body must be {\"charge_id\": \"ch_...\", \"points\": N}";
        },
        [](pqxx::work& tx,
           const idemsaga::steps::guard::Request& req) -> idemsaga::steps::guard::Response {
          tx.exec_params("INSERT INTO points (key, charge_id, points) VALUES ($1, $2, $3)", req.key,
                         req.body["charge_id"].get<std::string>(), req.body["points"].get<int>());
          return {201,
                  nlohmann::json{{"points_id", "pts_" + idemsaga::common::RandomHex(8)}}.dump()};
        });
    participant_.Compensation(server, "/v1/points/revoke",
                              [](pqxx::work& tx, const idemsaga::steps::guard::Request&,
                                 const idemsaga::steps::guard::ActionRecord& action) {
                                tx.exec_params("UPDATE points SET revoked = true WHERE key = $1",
                                               action.key);
                                return nlohmann::json::object();
                              });
    participant_.Action(
        server, "/v1/vouchers",
        [](const nlohmann::json& b) {
          return b.is_object() && b.size() == 1 && b.contains("cents") &&
                         b["cents"].is_number_integer()
                     ? ""
                     : "the body must be {\"cents\": N}";
        },
        [](pqxx::work& tx,
           const idemsaga::steps::guard::Request& req) -> idemsaga::steps::guard::Response {
          if (req.body["cents"].get<int>() > 1000) {
            return idemsaga::steps::guard::Problem(422, "voucher_limit",
                                                   "vouchers go up to 1000 cents");
          }
          tx.exec_params("INSERT INTO vouchers (key) VALUES ($1)", req.key);
          return {201,
                  nlohmann::json{{"voucher_id", "vch_" + idemsaga::common::RandomHex(8)}}.dump()};
        });
    participant_.Compensation(server, "/v1/vouchers/void",
                              [](pqxx::work& tx, const idemsaga::steps::guard::Request&,
                                 const idemsaga::steps::guard::ActionRecord& a) {
                                tx.exec_params("DELETE FROM vouchers WHERE key = $1", a.key);
                                return nlohmann::json::object();
                              });
  }
  std::string Url() const { return server_.Url(); }

 private:
  idemsaga::common::pg::Pool pool_;
  idemsaga::demo::Faults faults_;
  idemsaga::demo::GuardedRoutes participant_;
  Serving<idemsaga::common::http::Server> server_;
};

struct GiftBox {
  std::string customer_id;
  std::string sku;
  long long quantity;
  long long amount_cents;
  long long voucher_cents;
};

GiftBox ParseGiftBox(const nlohmann::json& body) {
  idemsaga::steps::saga::Fields f(body);
  GiftBox in{f.Text("customer_id", 64), f.Text("sku", 64), f.Integer("quantity", 1, 100),
             f.Integer("amount_cents", 1, 100000), f.Integer("voucher_cents", 0, 100000)};
  f.Done();
  return in;
}

// What each compensation saw: its step and the outputs of the steps before it.
struct Seen {
  std::string step;
  nlohmann::json outputs;
};
std::mutex seen_mutex;
std::vector<Seen> seen;

idemsaga::steps::saga::StepFn Observed(const std::string& step,
                                       const idemsaga::steps::saga::StepFn& undo) {
  return [step, undo](idemsaga::steps::saga::StepContext& ctx) {
    {
      std::lock_guard lock(seen_mutex);
      seen.push_back({step, *ctx.outputs});
    }
    return undo(ctx);
  };
}

// The payment step's output, typed.
struct Charge {
  std::string id;
};
Charge ParseCharge(const nlohmann::json& output) {
  if (!output.contains("charge_id") || !output["charge_id"].is_string()) {
    throw idemsaga::steps::saga::InvalidInput("charge_id must be a string");
  }
  return {output["charge_id"].get<std::string>()};
}

idemsaga::steps::saga::Definition MakeGiftBoxSaga(idemsaga::Participants& p) {
  auto& inventory = p.Get("inventory");
  auto& payment = p.Get("payment");
  auto& loyalty = p.Get("loyalty");
  using Ctx = idemsaga::steps::saga::StepContext;
  return idemsaga::steps::saga::Definition("gift_box", 3)
      .Input<GiftBox>(ParseGiftBox)
      .Step(
          "inventory",
          [&](Ctx& ctx) {
            const auto& in = ctx.Input<GiftBox>();
            return inventory.Post("/v1/reservations", ctx,
                                  {{"items", {{{"sku", in.sku}, {"quantity", in.quantity}}}}});
          },
          Observed("inventory",
                   [&](Ctx& ctx) { return inventory.Compensate("/v1/reservations/release", ctx); }))
      .Step(
          "payment",
          [&](Ctx& ctx) {
            const auto& in = ctx.Input<GiftBox>();
            return payment.Post("/v1/charges", ctx,
                                {{"amount_cents", in.amount_cents},
                                 {"currency", "EUR"},
                                 {"customer_id", in.customer_id},
                                 {"payment_method", "pm_card_visa"}});
          },
          Observed("payment", [&](Ctx& ctx) { return payment.Compensate("/v1/refunds", ctx); }))
      .Output<Charge>(ParseCharge)
      .Step("points",
            [&](Ctx& ctx) {
              return loyalty.Post("/v1/points", ctx,
                                  {{"charge_id", ctx.Output<Charge>("payment").id},
                                   {"points", ctx.Input<GiftBox>().amount_cents / 100}});
            },
            Observed("points",
                     [&](Ctx& ctx) { return loyalty.Compensate("/v1/points/revoke", ctx); }),
            {.max_attempts = 3, .call_timeout = 2s})
      .Step(
          "voucher",
          [&](Ctx& ctx) {
            return loyalty.Post("/v1/vouchers", ctx,
                                {{"cents", ctx.Input<GiftBox>().voucher_cents}});
          },
          Observed("voucher",
                   [&](Ctx& ctx) { return loyalty.Compensate("/v1/vouchers/void", ctx); }))
      .Answer([](const Ctx& ctx) {
        return idemsaga::steps::saga::SuccessAnswer{
            201,
            {{"status", "completed"},
             {"idempotency_key", ctx.parent_key},
             {"reservation_id", ctx.Output("inventory")["reservation_id"]},
             {"charge_id", ctx.Output<Charge>("payment").id},
             {"points", ctx.Input<GiftBox>().amount_cents / 100}}};
      });
}

constexpr const char* kGift =
    R"({"customer_id":"cust_9","sku":"widget","quantity":1,"amount_cents":4200,"voucher_cents":500})";
constexpr const char* kTooBigGift =
    R"({"customer_id":"cust_9","sku":"widget","quantity":1,"amount_cents":4200,"voucher_cents":5000})";

OrchestratorOptions Options(const std::string& db, const std::string& inventory,
                            const std::string& payment, const std::string& loyalty,
                            const std::string& shipping = "http://127.0.0.1:1") {
  auto o = test_support::DemoOrchestratorOptions(
      db, {{"inventory", inventory}, {"payment", payment}, {"shipping", shipping}});
  o.participants["loyalty"] = {.base_url = loyalty, .business_errors = {"voucher_limit"}};
  o.retry = {.max_attempts = 4,
             .initial_backoff = 5ms,
             .max_backoff = 40ms,
             .step_deadline = 4000ms,
             .compensation_stuck_after = 100};
  o.store.lease = 2s;
  o.recovery.sweep_interval = 100ms;
  o.sagas.threads = 8;
  return o;
}

// --- the test ---------------------------------------------------------------------------------

class SagasTest : public ::testing::Test {
 protected:
  SagasTest()
      : orch_db_("orchestrator"),
        inv_db_("inventory"),
        pay_db_("payment"),
        loyalty_db_("payment"),  // a participant database: it has the guard's key table
        ship_db_("shipping"),
        inventory_(ParticipantKind::kInventory, inv_db_.url(),
                   idemsaga::demo::ParticipantOptions{}),
        payment_(ParticipantKind::kPayment, pay_db_.url(), idemsaga::demo::ParticipantOptions{}),
        shipping_(ParticipantKind::kShipping, ship_db_.url(),
                  idemsaga::demo::ParticipantOptions{}) {
    loyalty_db_.Exec(
        "CREATE TABLE points (key text PRIMARY KEY, charge_id text NOT NULL, points int NOT NULL, "
        "revoked boolean NOT NULL DEFAULT false)");
    loyalty_db_.Exec("CREATE TABLE vouchers (key text PRIMARY KEY)");
    loyalty_ = std::make_unique<Loyalty>(loyalty_db_.url());
    std::lock_guard lock(seen_mutex);
    seen.clear();
  }

  OrchestratorOptions Opts() const {
    return Options(orch_db_.url(), inventory_.Url(), payment_.Url(), loyalty_->Url(),
                   shipping_.Url());
  }

  // The product's sagas and the user's, side by side.
  void Start() {
    auto sagas = idemsaga::steps::ShippedSagas();
    sagas.push_back(MakeGiftBoxSaga);
    orch_ = std::make_unique<Serving<Orchestrator>>(Opts(), sagas);
    orch_->service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
  }

  httplib::Result Run(const std::string& key, const std::string& body,
                      const std::string& saga = "gift_box") {
    auto client = orch_->Client();
    return Post(client, "/v1/runs/" + saga, Order(key, body));
  }

  nlohmann::json View(const std::string& path) {
    auto client = orch_->Client();
    auto r = client.Get(path.c_str(), {{"Authorization", "Bearer dev-key-demo"}});
    return r && r->status == 200 ? nlohmann::json::parse(r->body) : nlohmann::json();
  }

  // The reservation and charge the participants hold for `key`'s saga.
  std::string ReservationId(const std::string& key) {
    return inv_db_.Text("SELECT reservation_id FROM reservations WHERE idempotency_key = $1",
                        key + "-inventory");
  }
  std::string ChargeId(const std::string& key) {
    return pay_db_.Text("SELECT charge_id FROM charges WHERE idempotency_key = $1",
                        key + "-payment");
  }

  // Every compensation saw the outputs the participants hold, and they ran
  // in reverse: points, payment, inventory.
  void ExpectCompensatedInReverseWithOutputs(const std::string& key) {
    std::lock_guard lock(seen_mutex);
    std::vector<std::string> order;
    order.reserve(seen.size());
    for (const auto& s : seen) order.push_back(s.step);
    EXPECT_EQ(order, std::vector<std::string>({"points", "payment", "inventory"}));
    for (const auto& s : seen) {
      EXPECT_EQ(s.outputs["inventory"]["reservation_id"], ReservationId(key)) << s.step;
      EXPECT_EQ(s.outputs["payment"]["charge_id"], ChargeId(key)) << s.step;
      EXPECT_TRUE(s.outputs["points"]["points_id"].is_string()) << s.step;
      EXPECT_FALSE(s.outputs.contains("voucher")) << s.step;
    }
  }

  void ExpectEverythingUndoneOnce(const std::string& key) {
    EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM reservations WHERE status = 'released'"), 1);
    EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges WHERE status = 'refunded'"), 1);
    EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges"), 1);
    EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM points WHERE revoked"), 1);
    EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM vouchers"), 0);
    EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM points WHERE charge_id = $1", ChargeId(key)),
              1);
  }

  ScratchDatabase orch_db_, inv_db_, pay_db_, loyalty_db_, ship_db_;
  Serving<ParticipantService> inventory_, payment_, shipping_;
  std::unique_ptr<Loyalty> loyalty_;
  std::unique_ptr<Serving<Orchestrator>> orch_;
};

TEST_F(SagasTest, ASagaDeclaredInCodeRunsOverHttpWithItsTypedInputAndOutputs) {
  Start();
  auto r = Run("gift-1", kGift);
  ASSERT_EQ(r->status, 201) << r->body;
  // The answer the saga declares, as it declares it.
  EXPECT_EQ(nlohmann::json::parse(r->body),
            nlohmann::json({{"status", "completed"},
                            {"idempotency_key", "gift-1"},
                            {"reservation_id", ReservationId("gift-1")},
                            {"charge_id", ChargeId("gift-1")},
                            {"points", 42}}));
  // The points step was given the charge the payment step made.
  EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM points WHERE charge_id = $1 AND points = 42",
                              ChargeId("gift-1")),
            1);
  EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM vouchers"), 1);
  // Stored with its name and version; read back under its own route, never another saga's.
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                           "'gift-1' AND saga_name = 'gift_box' AND saga_version = 3"),
            1);
  auto view = View("/v1/runs/gift_box/gift-1");
  EXPECT_EQ(view["status"], "completed") << view.dump();
  EXPECT_EQ(view["saga_version"], 3);
  auto client_of = orch_->Client();
  auto other_saga =
      client_of.Get("/v1/runs/place_order/gift-1", {{"Authorization", "Bearer dev-key-demo"}});
  EXPECT_EQ(other_saga->status, 404) << other_saga->body;
  // A retry replays the same bytes; the same key for another saga is a reuse.
  auto again = Run("gift-1", kGift);
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  auto client = orch_->Client();
  auto other = Post(client, "/v1/orders", Order("gift-1"));
  EXPECT_EQ(other->status, 422);
  EXPECT_EQ(ErrorCode(other), "idempotency_key_reused");
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges"), 1);
}

TEST_F(SagasTest, ABadInputIsRefusedNamingTheFieldAndAnUnknownSagaIs404) {
  Start();
  auto unknown_field = Run("bad-1", R"({"customer_id":"c","sku":"widget","quantity":1,)"
                                    R"("amount_cents":1,"voucher_cents":0,"colour":"red"})");
  EXPECT_EQ(unknown_field->status, 400);
  EXPECT_NE(unknown_field->body.find("unknown field 'colour'"), std::string::npos);
  auto out_of_range = Run("bad-2", R"({"customer_id":"c","sku":"widget","quantity":0,)"
                                   R"("amount_cents":1,"voucher_cents":0})");
  EXPECT_EQ(out_of_range->status, 400);
  EXPECT_NE(out_of_range->body.find("quantity must be an integer from 1 to 100"),
            std::string::npos);
  auto missing = Run("bad-3", R"({"customer_id":"c"})");
  EXPECT_NE(missing->body.find("sku is required"), std::string::npos);
  auto none = Run("bad-4", kGift, "no_such_saga");
  EXPECT_EQ(none->status, 404);
  EXPECT_EQ(ErrorCode(none), "saga_not_found");
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  // The list names what is served.
  auto list = View("/v1/runs");
  // place_order has two versions; place_order_parallel runs two of its steps side by side;
  // deliver_order runs place_order as a child, and awaits its events.
  ASSERT_EQ(list["sagas"].size(), 6u) << list.dump();
  EXPECT_EQ(list["sagas"][0]["name"], "deliver_order");
  EXPECT_EQ(list["sagas"][0]["children"],
            nlohmann::json::parse(R"([{"saga":"place_order","step":"order","version":2}])"));
  EXPECT_EQ(list["sagas"][0]["events"], nlohmann::json({"payment_confirmed", "payment_failed",
                                                        "order_approved", "order_rejected"}));
  EXPECT_EQ(list["sagas"][1]["name"], "gift_box");
  EXPECT_EQ(list["sagas"][1]["steps"],
            nlohmann::json({"inventory", "payment", "points", "voucher"}));
  EXPECT_EQ(list["sagas"][1]["parallel"], nlohmann::json::array());
  EXPECT_EQ(list["sagas"][1]["children"], nlohmann::json::array());
  EXPECT_EQ(list["sagas"][4]["name"], "place_order_parallel");
  EXPECT_EQ(list["sagas"][4]["parallel"], nlohmann::json::parse(R"([["inventory","payment"]])"));
}

TEST_F(SagasTest, ADeclinedLastStepCompensatesInReverseWithTheOutputsOfEarlierSteps) {
  Start();
  auto r = Run("gift-2", kTooBigGift);
  ASSERT_EQ(r->status, 422) << r->body;
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["code"], "voucher_limit");
  EXPECT_EQ(body["compensated"], nlohmann::json({"points", "payment", "inventory"}));
  ExpectCompensatedInReverseWithOutputs("gift-2");
  ExpectEverythingUndoneOnce("gift-2");
}

constexpr const char* kShipment =
    R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":2}],"amount_cents":2500,)"
    R"("currency":"USD","payment_method":"pm_card_visa","address":{"name":"Ada Lovelace",)"
    R"("line1":"12 St James's Square","city":"London","postal_code":"SW1Y 4JH","country":"GB"}})";

TEST_F(SagasTest, TheShippedShipOrderSagaShipsTheReservationItMadeOnce) {
  Start();
  auto r = Run("ship-1", kShipment, "ship_order");
  ASSERT_EQ(r->status, 201) << r->body;
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["reservation_id"], ReservationId("ship-1"));
  EXPECT_EQ(body["charge_id"], ChargeId("ship-1"));
  // One shipment, of the reservation the inventory step made, to the address given.
  EXPECT_EQ(ship_db_.Count("SELECT count(*) FROM shipments WHERE shipment_id = $1 AND "
                           "reservation_id = $2 AND address->>'country' = 'GB' AND "
                           "idempotency_key = 'ship-1-shipping' AND status = 'created'",
                           body["shipment_id"].get<std::string>(), ReservationId("ship-1")),
            1);
  auto again = Run("ship-1", kShipment, "ship_order");
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(ship_db_.Count("SELECT count(*) FROM shipments"), 1);
  EXPECT_EQ(View("/v1/runs/ship_order/ship-1")["steps"].size(), 3u);
  // /v1/orders/{key} reads orders only: a shipment run is not an order.
  auto client = orch_->Client();
  auto as_order = client.Get("/v1/orders/ship-1", {{"Authorization", "Bearer dev-key-demo"}});
  EXPECT_EQ(as_order->status, 404) << as_order->body;
}

TEST_F(SagasTest, AnUnservedCountryRefundsThenReleasesAndShipsNothing) {
  Start();
  auto far = nlohmann::json::parse(kShipment);
  far["address"]["country"] = "AQ";
  auto r = Run("ship-2", far.dump(), "ship_order");
  ASSERT_EQ(r->status, 422) << r->body;
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(body["code"], "address_unserviceable");
  EXPECT_EQ(body["compensated"], nlohmann::json({"payment", "inventory"}));
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges WHERE status = 'refunded'"), 1);
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM reservations WHERE status = 'released'"), 1);
  EXPECT_EQ(ship_db_.Count("SELECT count(*) FROM shipments"), 0);
  // An address the shipping participant would refuse as malformed is refused at the route.
  far["address"]["country"] = "gb";
  auto bad = Run("ship-3", far.dump(), "ship_order");
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("address.country"), std::string::npos) << bad->body;
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                           "'ship-3'"),
            0);
}

TEST_F(SagasTest, ASagaWhoseVersionThisBuildLacksGoesVisiblyStuckAndRunsNothing) {
  Start();  // serves gift_box version 3 only
  // A run started by another build, of version 7, whose owner died.
  auto& store = orch_->service.store();
  auto claim = store.ClaimKey({"demo", "gone-1", std::string(64, 'a'), nlohmann::json::parse(kGift),
                               "gift_box", 7, "another-build", std::string(32, 'b')});
  ASSERT_EQ(claim.kind, idemsaga::orchestrator::store::Claim::kClaimed);
  nlohmann::json view;
  ASSERT_TRUE(WaitFor(
      [&] {
        view = View("/v1/runs/gift_box/gone-1");
        return view.value("stuck", false);
      },
      20s))
      << view.dump();
  EXPECT_EQ(view["status"], "started");
  EXPECT_EQ(view["saga_version"], 7);
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
}

// Its steps' records are what an operator reads to set it right: a takeover that cannot read
// the stored input keeps them, runs nothing, and shows the saga stuck.
TEST_F(SagasTest, AStoredInputThisBuildCannotReadGoesStuckKeepingItsStepRecords) {
  Start();
  auto& store = orch_->service.store();
  auto unreadable = nlohmann::json::parse(kGift);
  unreadable["gift_wrap"] = true;  // a field this build's gift_box refuses
  auto claim = store.ClaimKey({"demo", "odd-1", std::string(64, 'a'), unreadable, "gift_box", 3,
                               "another-build", std::string(32, 'b')});
  ASSERT_EQ(claim.kind, idemsaga::orchestrator::store::Claim::kClaimed);
  nlohmann::json recorded = {{{"name", "inventory"},
                              {"action_key", "odd-1-inventory"},
                              {"status", "succeeded"},
                              {"attempts", 1}}};
  // Its owner recorded a step, deferred it, and died.
  ASSERT_TRUE(store.DeferStuck(claim.lease, recorded, 0ms));
  // Taken over here (epoch 2), then deferred at the stuck pace (5 s) rather than the lease's 2 s.
  ASSERT_TRUE(WaitFor(
      [&] {
        return orch_db_.Count(
                   "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                   "'odd-1' AND lease_epoch >= 2 AND lease_expires_at > now() + "
                   "interval '3 seconds'") == 1;
      },
      20s));
  auto view = View("/v1/runs/gift_box/odd-1");
  EXPECT_EQ(view["status"], "started") << view.dump();
  EXPECT_EQ(view["stuck"], true);
  ASSERT_EQ(view["steps"].size(), 1u) << view.dump();
  EXPECT_EQ(view["steps"][0]["status"], "succeeded");
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
}

// The child half of the next test: the orchestrator that dies. Skipped unless the parent ran
// this binary for it.
TEST(SagasChild, ServesTheGiftBoxSagaUntilItsCrashPoint) {
  const char* db = std::getenv("SAGAS_CHILD_DB");
  if (db == nullptr) GTEST_SKIP() << "run by SagasTest.AKill9BetweenTwoCompensations...";
  auto options = Options(db, std::getenv("SAGAS_CHILD_INVENTORY"),
                         std::getenv("SAGAS_CHILD_PAYMENT"), std::getenv("SAGAS_CHILD_LOYALTY"));
  // The engine reports boundaries to a hook; the kill is the stock binary's, installed here.
  options.sagas.at_boundary = idemsaga::cmd::CrashPointsFromEnvironment();
  Serving<Orchestrator> orch(options, std::vector<idemsaga::steps::SagaFactory>{MakeGiftBoxSaga});
  std::cout << "sagas-child-port=" << orch.port << std::endl;
  std::this_thread::sleep_for(60s);  // the crash point ends it long before
}

TEST_F(SagasTest, AKill9BetweenTwoCompensationsResumesWithTheSameOutputs) {
  Start();  // only to create the tenant; the child runs the saga
  orch_.reset();
  std::string log = ::testing::TempDir() + "sagas_child_" + std::to_string(getpid()) + ".log";
  std::remove(log.c_str());
  chaos::Process child({"/proc/self/exe", "--gtest_filter=SagasChild.*"},
                       {{"SAGAS_CHILD_DB", orch_db_.url()},
                        {"SAGAS_CHILD_INVENTORY", inventory_.Url()},
                        {"SAGAS_CHILD_PAYMENT", payment_.Url()},
                        {"SAGAS_CHILD_LOYALTY", loyalty_->Url()},
                        {"IDEMSAGA_CRASH_POINTS", "between_compensations"}},
                       log);
  int port = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(log);
        std::string line;
        while (std::getline(in, line)) {
          if (line.rfind("sagas-child-port=", 0) == 0) port = std::stoi(line.substr(17));
        }
        return port != 0;
      },
      20s));
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20);
  auto lost = Post(client, "/v1/runs/gift_box", Order("gift-3", kTooBigGift));
  EXPECT_FALSE(lost) << "the child answered instead of dying: " << lost->body;
  ASSERT_TRUE(child.Exited(10s));
  // It died after the first compensation (points), before the second.
  EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM points WHERE revoked"), 1);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges WHERE status = 'refunded'"), 0);

  Start();  // another owner: its sweeper takes the saga over once the child's lease expires
  auto view = nlohmann::json();
  ASSERT_TRUE(WaitFor(
      [&] {
        view = View("/v1/runs/gift_box/gift-3");
        return view.value("status", "") == "failed";
      },
      30s))
      << view.dump();
  // The new owner knows only what was made durable (the decision to compensate, with the
  // outputs): it undoes all three again in reverse, and the points' guard replays the undo
  // the child had committed.
  ExpectCompensatedInReverseWithOutputs("gift-3");
  ExpectEverythingUndoneOnce("gift-3");
  EXPECT_EQ(loyalty_db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                              "'gift-3-points-compensate'"),
            1);
  auto replay = Run("gift-3", kTooBigGift);
  EXPECT_EQ(replay->status, 422);
  EXPECT_EQ(nlohmann::json::parse(replay->body)["compensated"],
            nlohmann::json({"points", "payment", "inventory"}));
}

}  // namespace
