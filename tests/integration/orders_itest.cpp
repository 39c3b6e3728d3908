// The whole flow over real HTTP: the orchestrator and both participants on port 0, each with
// its own real PostgreSQL database. Invariants are counted in the participants' tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "common/crypto.hpp"
#include "demo/guarded_routes.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"
#include "orchestrator/reconcile.hpp"
#include "steps/place_order.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/metrics_text.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"
#include "tests/support/wait.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using idemsaga::orchestrator::Orchestrator;
using idemsaga::orchestrator::OrchestratorOptions;
using test_support::Call;
using test_support::ErrorCode;
using test_support::kDeclinedOrder;
using test_support::kOrder;
using test_support::Order;
using test_support::Post;
using test_support::ScratchDatabase;
using test_support::Serving;
using test_support::WaitFor;
using namespace std::chrono_literals;

constexpr const char* kGadgetOrder =
    R"({"customer_id":"cust_1","items":[{"sku":"gadget","quantity":11}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_visa"})";

// Fast retries so that failure paths finish in milliseconds.
OrchestratorOptions TestOptions(const std::string& db, const std::string& inventory,
                                const std::string& payment) {
  auto o =
      test_support::DemoOrchestratorOptions(db, {{"inventory", inventory}, {"payment", payment}});
  o.retry = {.max_attempts = 4,
             .initial_backoff = std::chrono::milliseconds(5),
             .max_backoff = std::chrono::milliseconds(40),
             .step_deadline = std::chrono::milliseconds(4000)};
  o.sagas.threads = 16;
  return o;
}

// A step of a saga with its action and/or compensation wrapped: `wrap(inner)` returns the
// function to call instead (to observe a step, or to perturb it as a fault would).
using Wrap = std::function<idemsaga::steps::saga::StepFn(idemsaga::steps::saga::StepFn inner)>;
idemsaga::steps::saga::Definition Wrapped(const idemsaga::steps::saga::Definition& real,
                                          const std::string& step, Wrap action,
                                          Wrap compensation = {}) {
  idemsaga::steps::saga::Definition d(real.name());
  for (const auto& s : real.steps()) {
    bool wrap = s.name == step;
    d.Step(s.name, wrap && action ? action(s.action) : s.action,
           wrap && compensation ? compensation(s.compensation) : s.compensation);
  }
  return d;
}

// `factory` replaces the order saga (wrapped steps, a step more); the shipped sagas otherwise.
using OrderSagaFactory = std::function<idemsaga::steps::saga::Definition(
    idemsaga::ParticipantClient&, idemsaga::ParticipantClient&)>;
std::vector<idemsaga::steps::SagaFactory> OrderSagas(const OrderSagaFactory& factory) {
  if (!factory) return idemsaga::steps::ShippedSagas();
  return {[factory](idemsaga::Participants& p) {
    return factory(p.Get("inventory"), p.Get("payment"));
  }};
}

class OrdersTest : public ::testing::Test {
 protected:
  OrdersTest()
      : orch_db_("orchestrator"),
        inv_db_("inventory"),
        pay_db_("payment"),
        inventory_(ParticipantKind::kInventory, inv_db_.url(),
                   idemsaga::demo::ParticipantOptions{}),
        payment_(ParticipantKind::kPayment, pay_db_.url(), idemsaga::demo::ParticipantOptions{}) {}

  void SetUp() override { Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url())); }

  void Start(OrchestratorOptions options, OrderSagaFactory factory = {}) {
    orch_.reset();
    orch_ = std::make_unique<Serving<Orchestrator>>(std::move(options), OrderSagas(factory));
    orch_->service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
    orch_->service.store().UpsertTenant("acme", idemsaga::common::Sha256Hex("dev-key-acme"));
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
  nlohmann::json View(const std::string& key) { return nlohmann::json::parse(Get(key)->body); }
  // Polls the saga until `done(view)` holds; returns the last view.
  template <typename Done>
  nlohmann::json WaitForView(const std::string& key, Done done,
                             std::chrono::milliseconds timeout = 20s) {
    nlohmann::json view;
    WaitFor(
        [&] {
          view = View(key);
          return done(view);
        },
        timeout, 20ms);
    return view;
  }
  nlohmann::json WaitForStatus(const std::string& key, const std::string& status,
                               std::chrono::milliseconds timeout = 20s) {
    return WaitForView(
        key, [&](const nlohmann::json& v) { return v.value("status", "") == status; }, timeout);
  }

  // The order saga with a third step, shipping, that refuses (422 undeliverable) after the
  // payment participant's GC collected the charge's key (past its retention): the charge's
  // compensation then finds no record of an action that certainly happened, and goes stuck.
  OrderSagaFactory ShippingThatLosesTheCharge() {
    return [this](idemsaga::ParticipantClient& inventory, idemsaga::ParticipantClient& payment) {
      auto d = idemsaga::steps::MakePlaceOrderSagaV1(inventory, payment);
      d.Step(
          "shipping",
          [this](idemsaga::steps::saga::StepContext&) {
            pay_db_.Exec("DELETE FROM idempotency_keys");
            return idemsaga::steps::saga::StepResult::Terminal(422, "undeliverable",
                                                               "no such address");
          },
          [](idemsaga::steps::saga::StepContext&) {
            return idemsaga::steps::saga::StepResult::Succeeded({});
          });
      return d;
    };
  }

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

// A claim that keeps racing (here a trigger drops its insert: the key is never claimed and
// never found, as when its claimants keep rolling back) gives up after its attempts. The
// client is told it is an outage, safe to retry: 503, Retry-After, the outage's problem body,
// nothing done; the retry with the same key, once the race is over, runs the order once.
TEST_F(OrdersTest, AClaimThatKeepsRacingIsA503WithRetryAfterAndTheRetryIsSafe) {
  orch_db_.KeyClaimsKeepRacing(true);
  const std::string trace = "6bf92f3577b34da6a3ce929d0e0e4738";
  auto call = Order("raced-1");
  call.extra = {{"traceparent", "00-" + trace + "-00f067aa0ba902b7-01"}};
  auto raced = Submit(call);
  orch_db_.KeyClaimsKeepRacing(false);
  test_support::ExpectOutageAnswer(raced);
  // Its request span says the server failed (common/trace/span_status.hpp).
  EXPECT_TRUE(test_support::WaitFor(
      [&] {
        return orch_db_.Count(
                   "SELECT count(*) FROM spans WHERE trace_id = $1 AND "
                   "name = 'POST /v1/orders' AND status = 'error'",
                   trace) == 1;
      },
      std::chrono::seconds(10)));
  EXPECT_EQ(Reservations(), 0);
  EXPECT_EQ(Charges(), 0);

  auto retried = Submit(Order("raced-1"));
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->status, 201) << retried->body;
  EXPECT_EQ(Reservations("reserved"), 1);
  EXPECT_EQ(Charges("captured"), 1);
}

// No shipping participant is named here: ship_order is not served (not listed, 404), rather
// than served against a default URL where nothing may listen.
TEST_F(OrdersTest, ASagaWhoseOptionalParticipantIsNotConfiguredIsNotServed) {
  auto runs = client_->Get("/v1/runs", {{"Authorization", "Bearer dev-key-demo"}});
  ASSERT_EQ(runs->status, 200);
  auto sagas = nlohmann::json::parse(runs->body)["sagas"];
  ASSERT_EQ(sagas.size(), 3u) << runs->body;  // place_order's two versions, and its variant
  EXPECT_EQ(sagas[0]["name"], "place_order");
  EXPECT_EQ(sagas[1]["name"], "place_order");
  EXPECT_EQ(sagas[1]["version"], 2);
  EXPECT_EQ(sagas[1]["events"], nlohmann::json({"payment_confirmed", "payment_failed"}));
  EXPECT_EQ(sagas[2]["name"], "place_order_parallel");
  auto ship = Post(*client_, "/v1/runs/ship_order", Order("no-ship"));
  EXPECT_EQ(ship->status, 404) << ship->body;
  EXPECT_EQ(ParentKeys(), 0);
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

// The answer's headers are part of it: a 201 says where the order is read, and every replay
// says so too, from memory and, after a restart, from the database.
TEST_F(OrdersTest, TheStoredAnswersHeadersAreReplayedWithIt) {
  auto first = Submit(Order("order-h"));
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_EQ(first->get_header_value("Location"), "/v1/orders/order-h");
  EXPECT_EQ(first->get_header_value("Content-Type"), "application/json");
  EXPECT_EQ(orch_db_.Text("SELECT response_headers->>'Location' FROM idempotency_keys "
                          "WHERE idempotency_key = 'order-h'"),
            "/v1/orders/order-h");
  auto from_memory = Submit(Order("order-h"));
  Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url()));  // memory is gone
  auto from_database = Submit(Order("order-h"));
  for (const auto& replay : {&from_memory, &from_database}) {
    ASSERT_TRUE(*replay);
    EXPECT_EQ((*replay)->body, first->body);
    EXPECT_EQ((*replay)->get_header_value("Location"), "/v1/orders/order-h");
    EXPECT_EQ((*replay)->get_header_value("Content-Type"), "application/json");
    EXPECT_EQ((*replay)->get_header_value("Idempotent-Replayed"), "true");
  }
  // A replay from memory is answered on the server's event loop, one from the database by a
  // worker: the same status and headers (but the request's own traceparent), byte for byte.
  auto again_from_memory = Submit(Order("order-h"));
  ASSERT_TRUE(again_from_memory);
  auto headers = [](const httplib::Result& r) {
    std::multimap<std::string, std::string> out;
    for (const auto& [name, value] : r->headers) {
      if (name != "traceparent") out.emplace(name, value);
    }
    return out;
  };
  EXPECT_EQ(again_from_memory->status, from_database->status);
  EXPECT_EQ(headers(again_from_memory), headers(from_database));
  EXPECT_EQ(again_from_memory->body, from_database->body);
}

// A finished answer never changes, so once replayed this process replays it from memory: with
// the parent table locked against every reader, the replay and the 422 still come at once, byte
// for byte; the same key of another tenant is never answered from that memory.
TEST_F(OrdersTest, AFinishedOrderIsReplayedFromMemoryButNeverToAnotherTenant) {
  auto first = Submit(Order("cached-1"));
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 201);
  auto from_db = Submit(Order("cached-1"));  // the first replay reads the row, and remembers it
  ASSERT_TRUE(from_db);
  EXPECT_EQ(from_db->body, first->body);
  pqxx::connection locker(orch_db_.url());
  pqxx::work lock(locker);
  lock.exec("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE");
  auto again = Submit(Order("cached-1"));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  auto reused = Submit(Order("cached-1", kDeclinedOrder));
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(ErrorCode(reused), "idempotency_key_reused");
  // acme's "cached-1" is another key: it must reach the (locked) table and wait there.
  auto other = Submit(Order("cached-1", kOrder, "dev-key-acme"));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 503) << other->body;
  lock.abort();
  other = Submit(Order("cached-1", kOrder, "dev-key-acme"));
  EXPECT_EQ(other->status, 201) << other->body;
  EXPECT_NE(nlohmann::json::parse(other->body)["order_id"],
            nlohmann::json::parse(first->body)["order_id"]);
  EXPECT_EQ(Charges(), 2);
}

TEST_F(OrdersTest, ADeclinedPaymentReleasesTheStockExactlyOnceAndChargesNothing) {
  auto r = Submit(Order("order-3", kDeclinedOrder));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 402);
  auto body = nlohmann::json::parse(r->body);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(body["status"], 402);
  EXPECT_EQ(body["saga_status"], "failed");
  EXPECT_EQ(body["step"], "payment");
  EXPECT_EQ(body["code"], "card_declined");
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

// The views below are the bytes main 6307083 served (captured from its `idemsaga dev` stack)
// before the parent row's steps and failure were read into types; only the values that differ
// per run are replaced. Reading the row once must not change a byte of what is shown.
constexpr const char* kDeclinedView =
    R"({"created_at":"<created_at>","failed_step":"payment","idempotency_key":"order-3",)"
    R"("last_error":{"attempts":1,"compensation":false,"detail":"the card was declined",)"
    R"("step":"payment"},"order_id":"<order_id>","response":{"body":{"code":"card_declined",)"
    R"("compensated":["inventory"],"detail":"the card was declined",)"
    R"("idempotency_key":"order-3","order_id":"<order_id>","retryable":false,)"
    R"("saga_status":"failed","status":402,"step":"payment","title":"Card declined",)"
    R"("trace_id":"<trace_id>","type":"https://idemsaga.dev/problems/card_declined"},)"
    R"("status":402},"saga":"place_order","saga_version":2,"status":"failed",)"
    R"("steps":[{"attempts":1,"compensation_attempts":1,"derived_key":"order-3-inventory",)"
    R"("name":"inventory","replayed":false,"status":"compensated"},{"attempts":1,)"
    R"("compensation_attempts":0,"derived_key":"order-3-payment",)"
    R"("detail":"the card was declined","name":"payment","replayed":false,"status":"failed"},)"
    R"({"attempts":0,"compensation_attempts":0,"derived_key":"","name":"confirmation",)"
    R"("replayed":false,"status":"not_run"},{"attempts":0,"compensation_attempts":0,)"
    R"("derived_key":"order-3-capture","name":"capture","replayed":false,"status":"not_run"}],)"
    R"("stuck":false,"trace_id":"<trace_id>","updated_at":"<updated_at>"})";
constexpr const char* kMixedView =
    R"({"created_at":"<created_at>","failed_step":"payment","idempotency_key":"mixed-1",)"
    R"("last_error":{"attempts":1,"compensation":false,"detail":"undone","step":"inventory"},)"
    R"("order_id":"ord_mixed","response":{"body":{"code":"card_declined"},"status":402},)"
    R"("saga":"place_order","saga_version":1,"status":"failed","steps":[{"attempts":1,)"
    R"("compensation_attempts":2,"derived_key":"mixed-1-inventory","detail":"undone",)"
    R"("name":"inventory","replayed":false,"status":"compensated"},)"
    R"({"unreadable":{"action_key":"mixed-1-payment","name":"payment",)"
    R"("status":"from_a_newer_build"}},{"unreadable":1}],"stuck":false,)"
    R"("trace_id":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","updated_at":"<created_at>"})";

// `body` with each of `fields`' values (in `body`'s JSON) replaced by <field>, wherever it occurs.
std::string Normalised(std::string body, std::initializer_list<const char*> fields) {
  auto view = nlohmann::json::parse(body);
  for (const char* field : fields) {
    const std::string value = view[field].get<std::string>();
    for (size_t at = body.find(value); at != std::string::npos; at = body.find(value, at)) {
      body.replace(at, value.size(), std::string("<") + field + ">");
    }
  }
  return body;
}

TEST_F(OrdersTest, TheViewOfADeclinedOrderIsTheBytesItWas) {
  ASSERT_EQ(Submit(Order("order-3", kDeclinedOrder))->status, 402);
  auto r = Get("order-3");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Normalised(r->body, {"order_id", "trace_id", "created_at", "updated_at"}),
            kDeclinedView);
}

// A record this build cannot read is shown as stored, in its place among the readable ones.
TEST_F(OrdersTest, AStepRecordThisBuildCannotReadIsShownAsStoredInItsPlace) {
  orch_db_.Exec(R"sql(
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body,
      saga_name, order_id, status, steps, trace_id, expires_at, failed_step, failure,
      response_status, response_body, response_headers, completed_at)
    VALUES ('demo', 'mixed-1', repeat('a', 64), '{}', 'place_order', 'ord_mixed', 'failed',
      '[{"name":"inventory","action_key":"mixed-1-inventory","status":"compensated",
         "attempts":1,"compensation_attempts":2,"detail":"undone"},
        {"name":"payment","action_key":"mixed-1-payment","status":"from_a_newer_build"}, 1]',
      repeat('b', 32), now() + interval '1 day', 'payment',
      '{"outcome":"terminal","http_status":402}', 402, '{"code":"card_declined"}',
      '{"Content-Type":"application/problem+json"}', now()))sql");
  auto r = Get("mixed-1");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Normalised(r->body, {"created_at", "updated_at"}), kMixedView);
}

TEST_F(OrdersTest, MetricsCountKeysStepsCompensationsAndDurationsAndPassPromtool) {
  ASSERT_EQ(Submit(Order("m-1"))->status, 201);
  ASSERT_EQ(Submit(Order("m-1"))->status, 201);                  // replayed
  ASSERT_EQ(Submit(Order("m-1", kDeclinedOrder))->status, 422);  // reused
  ASSERT_EQ(Submit(Order("m-2", kDeclinedOrder))->status, 402);  // compensated
  auto page = client_->Get("/metrics")->body;
  auto sample = [&](const std::string& series) { return test_support::Sample(page, series); };
  EXPECT_EQ(sample(R"(idemsaga_idempotency_requests_total{outcome="claimed"})"), 2) << page;
  EXPECT_EQ(sample(R"(idemsaga_idempotency_requests_total{outcome="replayed"})"), 1);
  EXPECT_EQ(sample(R"(idemsaga_idempotency_requests_total{outcome="reused"})"), 1);
  EXPECT_EQ(sample(R"(idemsaga_idempotency_requests_total{outcome="in_progress"})"), 0);
  const std::string attempts = R"(idemsaga_step_attempts_total{saga="place_order",)";
  EXPECT_EQ(sample(attempts + R"(step="inventory",kind="action",outcome="succeeded"})"), 2);
  EXPECT_EQ(sample(attempts + R"(step="payment",kind="action",outcome="succeeded"})"), 1);
  EXPECT_EQ(sample(attempts + R"(step="payment",kind="action",outcome="terminal"})"), 1);
  EXPECT_EQ(sample(attempts + R"(step="inventory",kind="compensation",outcome="succeeded"})"), 1);
  EXPECT_EQ(
      sample(
          R"(idemsaga_compensations_total{saga="place_order",step="inventory",outcome="undone"})"),
      1);
  EXPECT_EQ(sample(R"(idemsaga_saga_duration_seconds_count{saga="place_order",end="completed"})"),
            1);
  EXPECT_EQ(sample(R"(idemsaga_saga_duration_seconds_count{saga="place_order",end="failed"})"), 1);
  EXPECT_EQ(sample("idemsaga_sagas_stuck"), 0);
  EXPECT_EQ(sample("idemsaga_sagas_running"), 0);
  EXPECT_EQ(sample("idemsaga_database_up"), 1);
  EXPECT_GE(sample("idemsaga_db_pool_waits_total"), 0);
  EXPECT_GE(sample("idemsaga_spans_dropped_total"), 0);
  // No key and no tenant is ever a label.
  EXPECT_EQ(page.find("m-1"), std::string::npos);
  EXPECT_EQ(page.find("demo"), std::string::npos);
  EXPECT_EQ(test_support::PromtoolProblems(page), "");
  EXPECT_EQ(test_support::PromtoolProblems(client_->Get("/metrics")->body), "");
}

// An operator cancels an order while its first step runs: it stops before the next step,
// undoes the reservation, charges nothing, and answers the waiting client 409
// saga_cancelled; the row says who cancelled it and why.
TEST_F(OrdersTest, ACancelledSagaStopsAtItsNextStepBoundaryAndCompensatesWhatRan) {
  std::promise<void> entered, release;
  auto released = release.get_future().share();
  auto factory = [&](idemsaga::ParticipantClient& inventory, idemsaga::ParticipantClient& payment) {
    return Wrapped(idemsaga::steps::MakePlaceOrderSagaV1(inventory, payment), "inventory",
                   [&](idemsaga::steps::saga::StepFn inner) -> idemsaga::steps::saga::StepFn {
                     return [&, inner](idemsaga::steps::saga::StepContext& ctx) {
                       auto r = inner(ctx);
                       entered.set_value();
                       released.wait();
                       return r;
                     };
                   });
  };
  Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url()), factory);
  std::optional<httplib::Result> answer_or;
  std::thread client([&] {
    auto c = orch_->Client();
    answer_or.emplace(Post(c, "/v1/orders", Order("cancel-1")));
  });
  entered.get_future().wait();
  auto cancel = [&](const std::string& key, const std::string& body) {
    return client_->Post(("/v1/sagas/" + key + "/cancel").c_str(),
                         {{"Authorization", "Bearer dev-key-demo"}}, body, "application/json");
  };
  EXPECT_EQ(cancel("cancel-1", R"({})")->status, 400);  // why is required
  auto accepted = cancel("cancel-1", R"({"reason":"customer called","operator":"bob"})");
  EXPECT_EQ(accepted->status, 202) << accepted->body;
  release.set_value();
  client.join();
  auto& answer = *answer_or;
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 409) << answer->body;
  EXPECT_EQ(ErrorCode(answer), "saga_cancelled");
  auto body = nlohmann::json::parse(answer->body);
  EXPECT_EQ(body["step"], "payment");
  EXPECT_EQ(body["compensated"], nlohmann::json::array({"inventory"}));
  EXPECT_EQ(Charges(), 0);
  EXPECT_EQ(Reservations("released"), 1);
  EXPECT_EQ(Available("widget"), 1000000);
  auto view = View("cancel-1");
  EXPECT_EQ(view["status"], "failed");
  EXPECT_EQ(view["cancel_requested"]["operator"], "bob");
  EXPECT_EQ(view["cancel_requested"]["reason"], "customer called");
  // Ended: a second cancel is refused and the stored answer stands.
  auto late = cancel("cancel-1", R"({"reason":"again"})");
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(ErrorCode(late), "not_cancellable");
  EXPECT_EQ(Submit(Order("cancel-1"))->body, answer->body);
}

TEST_F(OrdersTest, ACompletedSagaCannotBeCancelledAndKeepsItsCharge) {
  auto done = Submit(Order("done-1"));
  ASSERT_EQ(done->status, 201);
  auto r = client_->Post("/v1/sagas/done-1/cancel", {{"Authorization", "Bearer dev-key-demo"}},
                         R"({"reason":"too late"})", "application/json");
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(ErrorCode(r), "not_cancellable");
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(Submit(Order("done-1"))->body, done->body);
  EXPECT_EQ(View("done-1")["cancel_requested"], nullptr);
  auto other = client_->Post("/v1/sagas/done-1/cancel", {{"Authorization", "Bearer dev-key-acme"}},
                             R"({"reason":"not mine"})", "application/json");
  EXPECT_EQ(other->status, 404);
}

// Reconciliation finds nothing after a completed and a failed order, then exactly what was
// planted by hand in the participants' tables, each with its saga, step and participant.
TEST_F(OrdersTest, ReconcileAgreesWithTheParticipantsThenFindsEveryPlantedDiscrepancy) {
  ASSERT_EQ(Submit(Order("rec-ok"))->status, 201);
  ASSERT_EQ(Submit(Order("rec-ok2"))->status, 201);
  ASSERT_EQ(Submit(Order("rec-declined", kDeclinedOrder))->status, 402);
  auto reconcile = [&] {
    idemsaga::orchestrator::Reconciler r(
        orch_->service.store(),
        {{"inventory", {inventory_.Url(), idemsaga::demo::kServiceToken}},
         {"payment", {payment_.Url(), idemsaga::demo::kServiceToken}}},
        {.since = std::chrono::hours(1), .settle = std::chrono::seconds(0)});
    return r.Run();
  };
  auto clean = reconcile();
  EXPECT_TRUE(clean.clean()) << clean.ToText();
  EXPECT_EQ(clean.sagas_checked, 3);
  EXPECT_EQ(clean.keys_read, 7);  // 3 reservations, 1 release, 3 charges

  // A completed order whose charge was refunded behind the saga's back; another whose
  // reservation key is gone; a failed order whose reservation release is undone; a key that
  // no saga derived.
  pay_db_.Exec(
      "UPDATE idempotency_keys SET compensated_at = now() "
      "WHERE idempotency_key = 'rec-ok-payment'");
  inv_db_.Exec("DELETE FROM idempotency_keys WHERE idempotency_key = 'rec-ok2-inventory'");
  inv_db_.Exec(
      "UPDATE idempotency_keys SET compensated_at = NULL "
      "WHERE idempotency_key = 'rec-declined-inventory'");
  ASSERT_EQ(Post(*std::make_unique<httplib::Client>(inventory_.Client()), "/v1/reservations",
                 {.key = "stray-inventory", .body = R"({"items":[{"sku":"widget","quantity":1}]})"})
                ->status,
            201);
  auto found = reconcile();
  std::map<std::string, std::string> problems;  // key -> problem
  for (const auto& d : found.discrepancies) problems[d.key] = d.problem;
  EXPECT_EQ(problems,
            (std::map<std::string, std::string>{{"rec-ok-payment", "action_compensated"},
                                                {"rec-ok2-inventory", "action_missing"},
                                                {"rec-declined-inventory", "action_still_applied"},
                                                {"stray-inventory", "key_without_parent"}}))
      << found.ToText();
  for (const auto& d : found.discrepancies) {
    if (d.key == "rec-ok-payment") {
      EXPECT_EQ(d.participant, "payment");
      EXPECT_EQ(d.parent_key, "rec-ok");
      EXPECT_EQ(d.saga, "place_order");
      EXPECT_EQ(d.saga_status, "completed");
      EXPECT_EQ(d.step, "payment");
    }
  }
  EXPECT_NE(found.ToText().find("action_still_applied  tenant=demo key=rec-declined-inventory"),
            std::string::npos)
      << found.ToText();
  // The periodic job's numbers: the same run, through the orchestrator, in its metrics.
  auto report = orch_->service.Reconcile(std::chrono::hours(1));
  EXPECT_EQ(report.discrepancies.size(), 3u);  // the stray key is younger than the settle time
  auto page = client_->Get("/metrics")->body;
  EXPECT_EQ(test_support::Sample(page, "idemsaga_reconcile_discrepancies"), 3);
  EXPECT_EQ(test_support::Sample(page, R"(idemsaga_reconcile_runs_total{result="discrepancies"})"),
            1);
}

// A window holding far more discrepancies than a report should carry (a participant restored
// from an old backup, a table loaded by hand): the report lists the first max_listed and counts
// every one, so the periodic job's log line and memory stay bounded; and a tenant with more
// keys than max_keys is an error to shorten the window, not a map of all of them in memory.
TEST_F(OrdersTest, ReconcileCountsAStormOfDiscrepanciesAndListsOnlyTheFirst) {
  ASSERT_EQ(Submit(Order("storm-tpl"))->status, 201);
  constexpr int kStray = 2500;
  inv_db_.Exec(
      "DO $$ DECLARE r idempotency_keys; BEGIN "
      "SELECT * INTO r FROM idempotency_keys WHERE idempotency_key = 'storm-tpl-inventory'; "
      "FOR g IN 1.." +
      std::to_string(kStray) +
      " LOOP r.idempotency_key := 'stray-' || g || '-inventory'; "
      "INSERT INTO idempotency_keys SELECT (r).*; END LOOP; END $$");
  auto reconcile = [&](size_t max_listed, long long max_keys) {
    return idemsaga::orchestrator::Reconciler(
               orch_->service.store(),
               {{"inventory", {inventory_.Url(), idemsaga::demo::kServiceToken}},
                {"payment", {payment_.Url(), idemsaga::demo::kServiceToken}}},
               {.since = std::chrono::hours(1),
                .settle = std::chrono::seconds(0),
                .max_listed = max_listed,
                .max_keys = max_keys})
        .Run();
  };
  auto report = reconcile(100, 500000);
  EXPECT_TRUE(report.errors.empty()) << report.ToText();
  EXPECT_EQ(report.discrepancies_found, kStray);
  ASSERT_EQ(report.discrepancies.size(), 100U);
  for (const auto& d : report.discrepancies) EXPECT_EQ(d.problem, "key_without_parent");
  EXPECT_FALSE(report.clean());
  auto text = report.ToText();
  EXPECT_NE(text.find("2500 discrepancies, 0 errors (the first 100 listed)"), std::string::npos)
      << text.substr(0, 300);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 101);
  auto json = report.ToJson();
  EXPECT_EQ(json["discrepancies_found"], kStray);
  EXPECT_EQ(json["discrepancies"].size(), 100U);

  // More keys than the run may hold: an error for the tenant, and nothing judged from part of
  // its keys (which would report every saga past them).
  auto capped = reconcile(100, 1000);
  ASSERT_EQ(capped.errors.size(), 1U) << capped.ToText();
  EXPECT_NE(capped.errors[0].find("more than 1000 keys in the window"), std::string::npos)
      << capped.errors[0];
  EXPECT_EQ(capped.discrepancies_found, 0);
  EXPECT_LE(capped.keys_read, 1000 + 500);  // at most one page past the cap
  // The cap passed on a participant's last page (2,501 keys: five full pages and one of a
  // single key) is caught there, naming that participant, not the next one unread.
  auto at_last_page = reconcile(100, kStray);
  ASSERT_EQ(at_last_page.errors.size(), 1U) << at_last_page.ToText();
  EXPECT_NE(at_last_page.errors[0].find("participant inventory: more than 2500 keys"),
            std::string::npos)
      << at_last_page.errors[0];
  EXPECT_EQ(at_last_page.keys_read, kStray + 1);
  EXPECT_EQ(at_last_page.discrepancies_found, 0);

  // A run asked to stop ends at its next page.
  auto stopped = idemsaga::orchestrator::Reconciler(
                     orch_->service.store(),
                     {{"inventory", {inventory_.Url(), idemsaga::demo::kServiceToken}}},
                     {.since = std::chrono::hours(1), .stopping = [] { return true; }})
                     .Run();
  EXPECT_EQ(stopped.keys_read, 0);
  EXPECT_EQ(stopped.discrepancies_found, 0);
  EXPECT_FALSE(stopped.errors.empty());
}

TEST_F(OrdersTest, AnOutOfStockOrderChargesNothing) {
  auto r = Submit(Order("order-4", kGadgetOrder));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(nlohmann::json::parse(r->body)["code"], "insufficient_stock");
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
      {"service token is not an api key", Order("k", kOrder, idemsaga::demo::kServiceToken), 401,
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
  EXPECT_NE(
      nlohmann::json::parse(invalid->body)["detail"].get<std::string>().find("items[0].quantity"),
      std::string::npos);
  EXPECT_EQ(ParentKeys(), 0);
  EXPECT_EQ(Reservations(), 0);
  EXPECT_EQ(Charges(), 0);
}

TEST_F(OrdersTest, KeysInPathsAreExactBytesAndBadOnesAre400NeverA5xx) {
  ASSERT_EQ(Submit(Order(R"("a b/c%41+\"d")"))->status, 201);
  // The same key, percent-encoded in the path, reads back its order.
  auto found = Get("a%20b%2Fc%2541%2B%22d");
  ASSERT_EQ(found->status, 200) << found->body;
  EXPECT_EQ(nlohmann::json::parse(found->body)["idempotency_key"], R"(a b/c%41+"d)");
  EXPECT_EQ(Get("a%20b%2FcA%2B%22d")->status, 404);  // decoded once, never twice
  for (const char* bad : {"%FF", "abc%00junk", "tab%09key", "%", "%zz"}) {
    auto r = Get(bad);
    ASSERT_TRUE(r) << bad;
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
  }
  auto too_long = Get(std::string(201, 'k'));
  EXPECT_EQ(too_long->status, 400);
  EXPECT_EQ(ErrorCode(too_long), "idempotency_key_invalid");
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
  // Sent by the budget's watch while the saga runs on: the same trace as the saga's.
  auto accepted_body = nlohmann::json::parse(accepted->body);
  EXPECT_EQ(accepted_body["status"], "started");
  EXPECT_EQ(accepted->get_header_value("traceparent").substr(3, 32), accepted_body["trace_id"]);
  auto busy = Submit(Order("slow"));
  EXPECT_EQ(busy->status, 409);
  EXPECT_EQ(ErrorCode(busy), "idempotency_key_in_progress");
  EXPECT_TRUE(busy->has_header("Retry-After"));
  // Poll the saga (bounded), as a client following Location would.
  EXPECT_EQ(WaitForStatus("slow", "completed")["status"], "completed");
  auto final = Submit(Order("slow"));
  EXPECT_EQ(final->status, 201);
  EXPECT_EQ(final->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Charges(), 1);
}

// Past inline_limit sagas run on the pool, as every saga did before they ran on their
// request's thread: the same answers either way.
TEST_F(OrdersTest, SagasBeyondTheInlineLimitRunOnThePoolWithTheSameAnswers) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = std::chrono::milliseconds(200);
  options.sagas.inline_limit = 0;
  Start(options);
  auto done = Submit(Order("pooled"));
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 201) << done->body;
  payment_.service.faults().Set({.latency_ms = 1200});
  auto accepted = Submit(Order("pooled-slow"));
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->status, 202);
  EXPECT_EQ(WaitForStatus("pooled-slow", "completed")["status"], "completed");
  EXPECT_EQ(Charges(), 2);
  EXPECT_EQ(Submit(Order("pooled"))->body, done->body);
}

// One tenant's burst past its running limit waits, queued durably (202), instead of taking
// threads; another tenant's order meanwhile runs at once; every queued order completes.
TEST_F(OrdersTest, ATenantPastItsRunningLimitIsQueuedWhileAnotherTenantsOrderRuns) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.tenant_running_limit = 1;
  options.recovery.sweep_interval = 100ms;
  Start(options);
  payment_.service.faults().Set({.latency_ms = 400});  // each order holds its slot a while
  std::vector<std::future<int>> demo;
  for (int i = 0; i < 4; ++i) {
    demo.push_back(std::async(std::launch::async, [&, i] {
      auto c = orch_->Client();
      auto r = Post(c, "/v1/orders", Order("burst-" + std::to_string(i)));
      return r ? r->status : 0;
    }));
  }
  std::this_thread::sleep_for(100ms);  // the burst is in
  auto other = Submit(Order("other-tenant", kOrder, "dev-key-acme"));
  std::map<int, int> statuses;
  for (auto& f : demo) ++statuses[f.get()];
  EXPECT_EQ(statuses, (std::map<int, int>{{201, 1}, {202, 3}}));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 201) << other->body;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(WaitForStatus("burst-" + std::to_string(i), "completed", 30s)["status"], "completed");
  }
  EXPECT_EQ(Charges("captured"), 5);
  EXPECT_EQ(Reservations("reserved"), 5);
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
  auto view =
      WaitForView("order-6", [](const nlohmann::json& v) { return v.value("stuck", false); });
  EXPECT_TRUE(view.value("stuck", false)) << "a failing compensation must be visible";
  EXPECT_EQ(view["status"], "compensating");

  payment_.service.faults().Set({});  // payment heals: the compensations go through
  view = WaitForStatus("order-6", "failed");
  ASSERT_EQ(view["status"], "failed");
  EXPECT_FALSE(view["stuck"].get<bool>());
  auto final = Submit(Order("order-6"));
  // Final, and says so: not a 503 that invites retrying a key that only replays this.
  EXPECT_EQ(final->status, 502);
  auto body = nlohmann::json::parse(final->body);
  EXPECT_EQ(body["code"], "payment_unavailable");
  EXPECT_EQ(body["retryable"], false);
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
  // Every attempt the runner makes goes through this wrapper, which notes the key it sends.
  std::vector<std::string> payment_keys;
  std::mutex mutex;
  auto factory = [&](idemsaga::ParticipantClient& inventory, idemsaga::ParticipantClient& payment) {
    return Wrapped(idemsaga::steps::MakePlaceOrderSagaV1(inventory, payment), "payment",
                   [&](idemsaga::steps::saga::StepFn inner) {
                     return [&, inner](idemsaga::steps::saga::StepContext& ctx) {
                       std::lock_guard lock(mutex);
                       payment_keys.push_back(ctx.derived_key);
                       return inner(ctx);
                     };
                   });
  };
  Start(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url()), factory);
  payment_.service.faults().Set({.fail_next = 3});  // three 503s, then healthy
  auto r = Submit(Order("flaky"));
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(payment_keys, std::vector<std::string>(4, "flaky-payment"));
  EXPECT_EQ(View("flaky")["steps"][1]["attempts"], 4);
  // One charge, under the derived key, and no other key ever reached payment's table.
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM idempotency_keys"), 1);
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'demo' AND "
                          "idempotency_key = 'flaky-payment'"),
            1);
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

// --- Issue 8: promises at the edges ----------------------------------------------------------

// §2: a rolling deploy during a participant blip must not fail orders that would complete.
TEST_F(OrdersTest, ASigtermDuringRetriesLeavesTheOrderToAnotherReplicaAndCompensatesNothing) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = 200ms;
  options.retry.max_attempts = 1000;
  options.retry.step_deadline = 60s;
  Start(options);
  payment_.service.faults().Set({.error_rate = 1});
  auto accepted = Submit(Order("deploy-1"));
  ASSERT_EQ(accepted->status, 202) << accepted->body;
  // The reservation is in place and payment is being retried: now SIGTERM (what the signal
  // handler does: Shutdown with no grace left).
  ASSERT_TRUE(WaitFor([&] { return Reservations("reserved") == 1; }, 10s));
  orch_.reset();
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'started'"), 1)
      << "shutdown must leave the saga as it was, not decide to compensate";

  payment_.service.faults().Set({});
  auto replica = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  replica.recovery.sweep_interval = 50ms;
  Start(replica);  // another replica: its sweeper resumes the released lease
  auto view = WaitForStatus("deploy-1", "completed");
  ASSERT_EQ(view["status"], "completed") << view.dump();
  EXPECT_EQ(Reservations("reserved"), 1);
  EXPECT_EQ(Reservations("released"), 0);
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(Charges("refunded"), 0);
  EXPECT_EQ(inv_db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE "
                          "'%-compensate'"),
            0);
  auto final = Submit(Order("deploy-1"));
  EXPECT_EQ(final->status, 201);
  EXPECT_EQ(final->get_header_value("Idempotent-Replayed"), "true");
}

// §3: a participant restart of several seconds fails no order. Default retry policy.
TEST_F(OrdersTest, AParticipantDownForTenSecondsMidLoadDelaysOrdersButFailsNone) {
  int pay_port = idemsaga::common::FreeLoopbackPort();
  auto pay = std::make_unique<Serving<ParticipantService>>(test_support::AtPort{pay_port},
                                                           ParticipantKind::kPayment, pay_db_.url(),
                                                           idemsaga::demo::ParticipantOptions{});
  auto options = test_support::DemoOrchestratorOptions(
      orch_db_.url(), {{"inventory", inventory_.Url()}, {"payment", pay->Url()}});
  options.sagas.response_budget = 500ms;
  Start(options);  // the default RetryPolicy: what a user gets
  ASSERT_EQ(Submit(Order("before"))->status, 201);

  pay.reset();  // down: connections refused
  auto down_at = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int i = 0; i < 5; ++i) {
    clients.emplace_back([this, i] {
      auto client = orch_->Client();
      auto r = Post(client, "/v1/orders", Order("outage-" + std::to_string(i)));
      EXPECT_TRUE(r && r->status == 202) << (r ? r->body : "no answer");
    });
  }
  for (auto& t : clients) t.join();
  std::this_thread::sleep_until(down_at + 10s);  // the outage itself is what is tested
  pay = std::make_unique<Serving<ParticipantService>>(test_support::AtPort{pay_port},
                                                      ParticipantKind::kPayment, pay_db_.url(),
                                                      idemsaga::demo::ParticipantOptions{});
  for (int i = 0; i < 5; ++i) {
    auto key = "outage-" + std::to_string(i);
    auto view = WaitForView(
        key, [](const nlohmann::json& v) { return v["response"].is_object(); }, 60s);
    EXPECT_EQ(view["status"], "completed") << view.dump();
  }
  EXPECT_EQ(Charges("captured"), 6);
  EXPECT_EQ(Charges("refunded"), 0);
  EXPECT_EQ(Reservations("released"), 0);
}

// §6: a wrong service token is a configuration fault: nothing is stored for the customer.
TEST_F(OrdersTest, AWrongServiceTokenLeavesTheSagaVisiblyWaitingUntilTheTokenIsFixed) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.service_token = "not-the-token";
  options.sagas.response_budget = 300ms;
  options.retry.stuck_retry_interval = 200ms;
  Start(options);
  auto first = Submit(Order("token-1"));
  ASSERT_EQ(first->status, 202) << first->body;
  auto view =
      WaitForView("token-1", [](const nlohmann::json& v) { return v.value("stuck", false); });
  EXPECT_TRUE(view["stuck"].get<bool>());
  EXPECT_EQ(view["status"], "started");
  EXPECT_TRUE(view["response"].is_null()) << "a 401 must never become the customer's answer";
  EXPECT_EQ(Reservations(), 0);
  // A retry meanwhile hears "still running", never the participant's 401.
  auto retry = Submit(Order("token-1"));
  EXPECT_TRUE(retry->status == 409 || retry->status == 202) << retry->status << " " << retry->body;
  EXPECT_TRUE(retry->status != 409 || ErrorCode(retry) == "idempotency_key_in_progress")
      << retry->body;

  auto fixed = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  fixed.recovery.sweep_interval = 50ms;
  Start(fixed);  // redeployed with the right token: the deferred saga goes on
  view = WaitForStatus("token-1", "completed");
  ASSERT_EQ(view["status"], "completed") << view.dump();
  EXPECT_EQ(Charges("captured"), 1);
  EXPECT_EQ(Reservations("reserved"), 1);
  EXPECT_EQ(Submit(Order("token-1"))->status, 201);
}

TEST_F(OrdersTest, AWrongParticipantUrlIsAConfigurationFaultNotTheCustomersAnswer) {
  // The inventory URL points at the payment service: every reservation is a 404.
  auto options = TestOptions(orch_db_.url(), payment_.Url(), payment_.Url());
  options.sagas.response_budget = 300ms;
  Start(options);
  ASSERT_EQ(Submit(Order("url-1"))->status, 202);
  auto view = WaitForView("url-1", [](const nlohmann::json& v) { return v.value("stuck", false); });
  EXPECT_EQ(view["status"], "started");
  EXPECT_TRUE(view["response"].is_null());
  EXPECT_EQ(ParentKeys(), 1);
  EXPECT_EQ(Charges(), 0);
}

// §5: the payment applied, its answer was lost, the saga compensated; much later (the parent
// key collected) the client retries the same key. It must not be told "completed".
TEST_F(OrdersTest, ALateRetryOfACompensatedOrderIsNeverToldItCompleted) {
  std::atomic<bool> lose_answers{true};
  auto factory = [&](idemsaga::ParticipantClient& inventory, idemsaga::ParticipantClient& payment) {
    return Wrapped(idemsaga::steps::MakePlaceOrderSagaV1(inventory, payment), "payment",
                   [&](idemsaga::steps::saga::StepFn inner) {
                     return [&, inner](idemsaga::steps::saga::StepContext& ctx) {
                       auto r = inner(ctx);  // applied by the participant...
                       if (lose_answers)
                         return idemsaga::steps::saga::StepResult::InDoubt("answer lost");
                       return r;  // ...and, once answers get through, heard
                     };
                   });
  };
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  // The key's expiry is moved by hand below, behind the back of the in-memory copy of finished
  // answers (which otherwise never outlives a row's expiry).
  options.sagas.finished_cache.max_bytes = 0;
  Start(options, factory);
  auto failed = Submit(Order("late-1"));
  ASSERT_EQ(failed->status, 502) << failed->body;
  EXPECT_EQ(Charges("refunded"), 1);
  EXPECT_EQ(Reservations("released"), 1);

  // Retention passed: the parent key is collected (participants keep theirs longer).
  orch_db_.Exec("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'");
  EXPECT_EQ(orch_->service.store().DeleteExpired(100).keys, 1);
  lose_answers = false;
  auto late = Submit(Order("late-1"));
  ASSERT_TRUE(late);
  EXPECT_NE(late->status, 201) << late->body;
  EXPECT_EQ(nlohmann::json::parse(late->body)["saga_status"], "failed") << late->body;
  EXPECT_EQ(ErrorCode(late), "compensated");
  // Nothing was applied again, and the stock and the charge stay undone.
  EXPECT_EQ(Charges(), 1);
  EXPECT_EQ(Charges("refunded"), 1);
  EXPECT_EQ(Reservations(), 1);
  EXPECT_EQ(Reservations("released"), 1);
  EXPECT_EQ(Available("widget"), 1000000);
}

// §5/§7: the retention rule is checked at start-up, against what each participant says.
TEST_F(OrdersTest, AnOrchestratorRefusesToStartWhenAParticipantForgetsKeysTooSoon) {
  ScratchDatabase short_db("payment");
  Serving<ParticipantService> forgetful(
      ParticipantKind::kPayment, short_db.url(),
      idemsaga::demo::ParticipantOptions{.guard = {.retention = std::chrono::hours(12)}});
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), forgetful.Url());
  options.store.retention = std::chrono::hours(24);
  Orchestrator too_long(options);
  EXPECT_THROW(too_long.CheckParticipantRetention(), std::runtime_error);
  EXPECT_GT(too_long.RequiredParticipantRetention(), std::chrono::hours(24));

  options.store.retention = std::chrono::hours(6);
  Orchestrator fits(options);
  EXPECT_EQ(fits.CheckParticipantRetention(), 2);
}

// No library default is the demo's: an orchestrator given no service token, or no participant
// its sagas call, refuses to start and says what is missing, instead of calling the demo's
// ports with the public dev token.
TEST_F(OrdersTest, AnOrchestratorWithoutAServiceTokenOrParticipantsRefusesToStart) {
  auto no_token = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  no_token.service_token.clear();
  try {
    Orchestrator o(no_token);
    ADD_FAILURE() << "started without a service token";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no service token"), std::string::npos) << e.what();
  }
  OrchestratorOptions bare;  // nothing but a database
  bare.database_url = orch_db_.url();
  EXPECT_TRUE(bare.participants.empty());
  EXPECT_TRUE(bare.service_token.empty());
  try {
    Orchestrator o(bare);
    ADD_FAILURE() << "started with no participant";
  } catch (const std::out_of_range& e) {  // place_order's factory asks for its participants
    EXPECT_NE(std::string(e.what()).find("no participant named"), std::string::npos) << e.what();
  }
  // Sagas that each step aside when their participant is missing (as ship_order does without
  // shipping): an orchestrator left with none to serve is a misconfiguration too.
  std::vector<idemsaga::SagaFactory> absent = {
      [](idemsaga::Participants&) -> std::optional<idemsaga::Definition> { return std::nullopt; }};
  try {
    Orchestrator o(TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url()), absent);
    ADD_FAILURE() << "started serving no saga";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("none of its sagas can be served"), std::string::npos)
        << e.what();
  }
}

// §7: a participant that no longer has the record of an applied action (collected, restored
// from an old backup) must not count as compensated: the customer would stay charged.
TEST_F(OrdersTest, ACompensationThatFindsItsAppliedActionForgottenGoesStuckNotDone) {
  auto factory = ShippingThatLosesTheCharge();
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = 500ms;
  options.retry.stuck_retry_interval = 200ms;
  Start(options, factory);
  auto r = Submit(Order("forgot-1"));
  ASSERT_EQ(r->status, 202) << r->body;
  auto view =
      WaitForView("forgot-1", [](const nlohmann::json& v) { return v.value("stuck", false); });
  EXPECT_EQ(view["status"], "compensating");
  EXPECT_TRUE(view["response"].is_null()) << "never 'failed, compensated' with the charge kept";
  EXPECT_EQ(Charges("captured"), 1);  // still owed a refund: visible, not dropped
}

// An operator resolves the stuck compensation above by hand (the charge refunded at the
// payment provider): the saga goes on to undo the steps before it (the reservation), ends
// failed with the answer any failure gets, and the note is kept for operators only.
TEST_F(OrdersTest, AStuckCompensationFixedByHandIsResolvedAndEndsFailedWithItsUsualAnswer) {
  auto factory = ShippingThatLosesTheCharge();
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = 500ms;
  options.retry.stuck_retry_interval = 3s;
  Start(options, factory);
  ASSERT_EQ(Submit(Order("fix-1"))->status, 202);
  WaitForView("fix-1", [](const nlohmann::json& v) { return v.value("stuck", false); });
  auto resolve = [&](const std::string& key, const std::string& body,
                     const std::string& api_key = "dev-key-demo") {
    return client_->Post(("/v1/sagas/" + key + "/resolve").c_str(),
                         {{"Authorization", "Bearer " + api_key}}, body, "application/json");
  };
  // Refused while it is running, for a bad body, and for another tenant (as if absent).
  EXPECT_EQ(resolve("fix-1", R"({"note":""})")->status, 400);
  EXPECT_EQ(resolve("fix-1", R"({"note":"x","by":"me"})")->status, 400);
  EXPECT_EQ(resolve("fix-1", R"({"note":"x"})", "dev-key-acme")->status, 404);
  pay_db_.Exec("UPDATE charges SET status = 'refunded', refunded_at = now()");  // the fix
  int status = 0;
  std::string answer;
  // Recovery may be retrying it at this instant (then it is not stuck for a moment).
  WaitFor(
      [&] {
        auto r = resolve("fix-1", R"({"note":"refunded by hand, ticket 42","operator":"alice"})");
        status = r ? r->status : 0;
        answer = r ? r->body : "";
        return status != 409;
      },
      10s, 100ms);
  ASSERT_EQ(status, 202) << answer;
  EXPECT_EQ(nlohmann::json::parse(answer)["step"], "payment");
  auto view = WaitForStatus("fix-1", "failed");
  EXPECT_EQ(view["status"], "failed");
  EXPECT_EQ(Reservations("released"), 1);  // undone by the saga, after the operator's step
  EXPECT_FALSE(view["stuck"].get<bool>());
  EXPECT_EQ(view["resolution"]["operator"], "alice");
  EXPECT_EQ(view["resolution"]["note"], "refunded by hand, ticket 42");
  EXPECT_EQ(view["resolution"]["step"], "payment");
  EXPECT_TRUE(view["resolution"].contains("at"));
  // The client's answer is a failure like any other: the refused step, what was undone.
  auto replay = Submit(Order("fix-1"));
  EXPECT_EQ(replay->status, 422) << replay->body;
  auto body = nlohmann::json::parse(replay->body);
  EXPECT_EQ(body["code"], "undeliverable");
  EXPECT_EQ(body["compensated"], nlohmann::json::array({"payment", "inventory"}));
  EXPECT_EQ(replay->body.find("ticket 42"), std::string::npos);
  EXPECT_EQ(resolve("fix-1", R"({"note":"again"})")->status, 409);
  EXPECT_EQ(Charges("refunded"), 1);
}

// §7: a row this build cannot read must neither crash the process nor be dropped.
TEST_F(OrdersTest, AnUnreadableSagaRowIsKeptVisibleAndTheProcessSurvives) {
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.recovery.sweep_interval = 50ms;
  options.retry.stuck_retry_interval = 60s;
  Start(options);
  orch_db_.Exec(R"sql(
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body,
      saga_name, order_id, status, lease_owner, lease_expires_at, steps, trace_id, expires_at)
    VALUES ('demo', 'garbled', repeat('a', 64), '{}', 'place_order', 'ord_garbled',
      'compensating', 'gone', now() - interval '1 second', '[1, "two"]', repeat('b', 32),
      now() + interval '1 day'))sql");
  ASSERT_TRUE(WaitFor(
      [&] {
        return orch_db_.Count(
                   "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                   "'garbled' AND stuck AND lease_expires_at > now()") == 1;
      },
      10s));
  EXPECT_EQ(View("garbled")["status"], "compensating");
  EXPECT_EQ(Submit(Order("after-garbled"))->status, 201);  // still serving
}

// §7: outputs reach compensations resumed by another owner (crash, takeover, deferral).
TEST_F(OrdersTest, ACompensationResumedByAnotherOwnerSeesTheOutputsOfTheStepsItUndoes) {
  std::mutex mutex;
  std::vector<std::string> refunded_charge_ids;
  std::atomic<int> factory_calls{0};
  std::atomic<bool> first_owner_parked{false};
  std::atomic<bool> release_first_owner{false};
  auto factory = [&](idemsaga::ParticipantClient& inventory, idemsaga::ParticipantClient& payment) {
    const bool first_owner = factory_calls++ == 0;
    auto payment_seen = Wrapped(
        idemsaga::steps::MakePlaceOrderSagaV1(inventory, payment), "payment", {},
        [&](idemsaga::steps::saga::StepFn inner) {
          return [&, inner](idemsaga::steps::saga::StepContext& ctx) {
            const auto& out = (*ctx.outputs)["payment"];
            std::lock_guard lock(mutex);
            refunded_charge_ids.push_back(out.is_object() ? out.value("charge_id", "") : "");
            return inner(ctx);
          };
        });
    auto d = Wrapped(
        payment_seen, "inventory", {}, [&, first_owner](idemsaga::steps::saga::StepFn inner) {
          return [&, first_owner, inner](idemsaga::steps::saga::StepContext& ctx) {
            if (first_owner) {
              // The first owner stops dead between compensations (as under kill -9) until the
              // test ends; its records in the store are all the next owner gets.
              first_owner_parked = true;
              while (!release_first_owner) std::this_thread::sleep_for(5ms);
              return idemsaga::steps::saga::StepResult::InDoubt("the process was gone");
            }
            return inner(ctx);
          };
        });
    d.Step(
        "shipping",
        [](idemsaga::steps::saga::StepContext&) {
          return idemsaga::steps::saga::StepResult::Terminal(422, "undeliverable",
                                                             "no such address");
        },
        [](idemsaga::steps::saga::StepContext&) {
          return idemsaga::steps::saga::StepResult::Succeeded({});
        });
    return d;
  };
  auto options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  options.sagas.response_budget = 200ms;
  Start(options, factory);
  ASSERT_EQ(Submit(Order("outputs-1"))->status, 202);
  ASSERT_TRUE(WaitFor([&] { return first_owner_parked.load(); }, 10s));

  // Its lease runs out; a second replica takes the saga over from the stored records.
  auto second_options = TestOptions(orch_db_.url(), inventory_.Url(), payment_.Url());
  second_options.recovery.sweep_interval = 50ms;
  Serving<Orchestrator> second(second_options, OrderSagas(factory));
  // However the test ends: free the first owner, then stop it, while the locals its steps
  // refer to still exist (the fixture would stop it only after this body has returned).
  struct Release {
    std::atomic<bool>& flag;
    std::unique_ptr<Serving<Orchestrator>>& first;
    ~Release() {
      flag = true;
      first.reset();
    }
  } release{release_first_owner, orch_};
  orch_db_.Exec("UPDATE idempotency_keys SET lease_expires_at = now()");
  auto view = WaitForStatus("outputs-1", "failed");
  ASSERT_EQ(view["status"], "failed") << view.dump();
  EXPECT_EQ(Charges("refunded"), 1);
  std::string stored_charge;
  {
    pqxx::connection conn(pay_db_.url());
    pqxx::read_transaction tx(conn);
    stored_charge = tx.exec1("SELECT charge_id FROM charges")[0].as<std::string>();
  }
  std::lock_guard lock(mutex);
  // The first owner's refund (outputs in memory), then the second's (outputs from the store).
  ASSERT_EQ(refunded_charge_ids.size(), 2u);
  for (const auto& id : refunded_charge_ids) EXPECT_EQ(id, stored_charge);
  EXPECT_EQ(Reservations("released"), 1);
}

}  // namespace
