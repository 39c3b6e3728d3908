// The shipped order saga with a card that needs 3-D Secure (pm_card_3ds), over real HTTP with
// the real participants: the charge is only authorised, the saga parks waiting for the card
// holder's answer, and then captures (payment_confirmed), or releases the stock and voids the
// authorisation (payment_failed, or no answer in time). Money is counted in the payment
// participant's table, stock in the inventory's.
#include <gtest/gtest.h>

#include "steps/deliver_order.hpp"
#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;

constexpr auto kConfirmationTimeout = 3s;

class ThreeDSecure : public ::testing::Test {
 protected:
  ThreeDSecure()
      : stack_(
            [](idemsaga::orchestrator::OrchestratorOptions& o) {
              o.recovery.sweep_interval = 100ms;
            },
            idemsaga::steps::ShippedSagas({.confirmation_timeout = kConfirmationTimeout})),
        orch_(stack_.orch.Client()) {}

  httplib::Result Place(const std::string& key, const std::string& method = "pm_card_3ds") {
    return test_support::Post(orch_, "/v1/orders",
                              test_support::Order(key, test_support::OrderPaidBy(method)));
  }
  httplib::Result Answer(const std::string& key, const std::string& event,
                         const std::string& body = "{}") {
    return test_support::Post(orch_, "/v1/runs/place_order/" + key + "/events/" + event,
                              test_support::Order(key + "-" + event, body));
  }
  nlohmann::json View(const std::string& key) {
    auto r =
        orch_.Get("/v1/orders/" + key, httplib::Headers{{"Authorization", "Bearer dev-key-demo"}});
    return nlohmann::json::parse(r->body);
  }
  bool Ended(const std::string& key, const std::string& status) {
    return test_support::WaitFor([&] { return View(key)["status"] == status; }, 30s, 50ms);
  }
  std::string ChargeStatus(const std::string& key) { return stack_.ChargeStatus(key); }
  long long Reserved() {
    return stack_.inv_db.Count("SELECT coalesce(sum(reserved), 0) FROM stock");
  }

  test_support::Stack stack_;
  httplib::Client orch_;
};

TEST_F(ThreeDSecure, AConfirmedPaymentIsCapturedOnceAndTheOrderCompletes) {
  auto placed = Place("3ds-1");
  ASSERT_EQ(placed->status, 202) << placed->body;
  EXPECT_EQ(nlohmann::json::parse(placed->body)["waiting_for"],
            nlohmann::json({"payment_confirmed", "payment_failed"}));
  EXPECT_EQ(ChargeStatus("3ds-1"), "requires_action");
  EXPECT_EQ(View("3ds-1")["steps"][2]["status"], "waiting");

  auto confirmed = Answer("3ds-1", "payment_confirmed");
  ASSERT_EQ(confirmed->status, 202) << confirmed->body;
  ASSERT_TRUE(Ended("3ds-1", "completed")) << View("3ds-1").dump();
  EXPECT_EQ(ChargeStatus("3ds-1"), "captured");
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 1);
  EXPECT_EQ(Reserved(), 2);
  // The client's retry gets the stored 201, with the charge.
  auto replay = Place("3ds-1");
  ASSERT_EQ(replay->status, 201) << replay->body;
  EXPECT_EQ(replay->body, View("3ds-1")["response"]["body"].dump());
  EXPECT_TRUE(nlohmann::json::parse(replay->body).contains("charge_id"));
  // What the orchestrator recorded agrees with the participants' keys: the wait has none, the
  // capture has its own.
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                                "'3ds-1-capture'"),
            1);
}

TEST_F(ThreeDSecure, AFailedAuthenticationReleasesTheStockAndVoidsTheCharge) {
  ASSERT_EQ(Place("3ds-2")->status, 202);
  ASSERT_EQ(Answer("3ds-2", "payment_failed", R"({"reason":"authentication failed"})")->status,
            202);
  ASSERT_TRUE(Ended("3ds-2", "failed"));
  auto body = View("3ds-2")["response"]["body"];
  EXPECT_EQ(body["status"], 402);
  EXPECT_EQ(body["code"], "payment_failed");
  EXPECT_EQ(body["detail"], "authentication failed");
  EXPECT_EQ(body["compensated"], nlohmann::json({"payment", "inventory"}));
  EXPECT_EQ(ChargeStatus("3ds-2"), "refunded");
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(ThreeDSecure, NoAnswerInTimeReleasesTheStockAndVoidsTheCharge) {
  ASSERT_EQ(Place("3ds-3")->status, 202);
  ASSERT_TRUE(Ended("3ds-3", "failed"));
  auto body = View("3ds-3")["response"]["body"];
  EXPECT_EQ(body["code"], "payment_not_confirmed");
  EXPECT_EQ(ChargeStatus("3ds-3"), "refunded");
  EXPECT_EQ(Reserved(), 0);
  // Too late now: refused, nothing stored, the order's answer stands.
  auto late = Answer("3ds-3", "payment_confirmed");
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(test_support::ErrorCode(late), "event_not_accepted");
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM saga_events"), 0);
}

TEST_F(ThreeDSecure, AnAnswerThatIsNotOneTheSagaReadsIsRefusedAndStoresNothing) {
  ASSERT_EQ(Place("3ds-4")->status, 202);
  for (const auto& body : {R"({"reason":7})", R"({"amount_cents":1})", R"([1])", R"("yes")"}) {
    auto r = Answer("3ds-4", "payment_failed", body);
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_EQ(test_support::ErrorCode(r), "invalid_request") << body;
  }
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM saga_events"), 0);
  EXPECT_EQ(ChargeStatus("3ds-4"), "requires_action");
}

// ship_order cannot wait for the card holder: such a card is refused, never left authorised.
TEST_F(ThreeDSecure, ASagaThatCannotWaitForTheCardHolderIsRefusedAndChargesNothing) {
  nlohmann::json body = nlohmann::json::parse(test_support::OrderPaidBy("pm_card_3ds"));
  body["address"] = {{"name", "Ada Lovelace"},
                     {"line1", "12 St James's Square"},
                     {"city", "London"},
                     {"postal_code", "SW1Y 4JH"},
                     {"country", "GB"}};
  auto r = test_support::Post(orch_, "/v1/runs/ship_order",
                              test_support::Order("ship-3ds", body.dump()));
  ASSERT_EQ(r->status, 402) << r->body;
  EXPECT_EQ(test_support::ErrorCode(r), "authentication_required");
  EXPECT_EQ(nlohmann::json::parse(r->body)["compensated"], nlohmann::json({"inventory"}));
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 0);
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(ThreeDSecure, AnyOtherCardSkipsTheConfirmationAndTheCapture) {
  auto placed = Place("visa-1", "pm_card_visa");
  ASSERT_EQ(placed->status, 201) << placed->body;
  auto view = View("visa-1");
  EXPECT_EQ(view["saga_version"], 2);
  EXPECT_EQ(view["steps"][2]["status"], "skipped");
  EXPECT_EQ(view["steps"][3]["status"], "skipped");
  EXPECT_EQ(ChargeStatus("visa-1"), "captured");
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
  // It awaits nothing: the events route says so, and stores nothing.
  auto r = Answer("visa-1", "payment_confirmed");
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(test_support::ErrorCode(r), "event_not_accepted");
}

// deliver_order: place_order as a child saga, then the shipment. The child's wait for the
// card holder parks the delivery; its events are the delivery's.
class Delivery : public ThreeDSecure {
 protected:
  httplib::Result Deliver(const std::string& key, const std::string& method,
                          const std::string& country = "GB", long long amount_cents = 2500) {
    auto order = nlohmann::json::parse(test_support::OrderPaidBy(method));
    order["amount_cents"] = amount_cents;
    nlohmann::json body = {{"order", order},
                           {"address",
                            {{"name", "Ada Lovelace"},
                             {"line1", "12 St James's Square"},
                             {"city", "London"},
                             {"postal_code", "SW1Y 4JH"},
                             {"country", country}}}};
    return test_support::Post(orch_, "/v1/runs/deliver_order",
                              test_support::Order(key, body.dump()));
  }
  nlohmann::json RunView(const std::string& key) {
    auto r = orch_.Get("/v1/runs/deliver_order/" + key,
                       httplib::Headers{{"Authorization", "Bearer dev-key-demo"}});
    return nlohmann::json::parse(r->body);
  }
  httplib::Result Decide(const std::string& key, const std::string& event,
                         const std::string& body) {
    return test_support::Post(orch_, "/v1/runs/deliver_order/" + key + "/events/" + event,
                              test_support::Order(key + "-" + event, body));
  }
  long long Shipments(const std::string& key, const std::string& status) {
    return stack_.ship_db.Count(
        "SELECT count(*) FROM shipments WHERE idempotency_key = $1 AND status = $2",
        key + "-shipping", status);
  }
};

TEST_F(Delivery, TheChildOrdersWaitParksTheDeliveryWhichShipsOnceThePaymentIsConfirmed) {
  auto placed = Deliver("dlv-1", "pm_card_3ds");
  ASSERT_EQ(placed->status, 202) << placed->body;
  EXPECT_EQ(nlohmann::json::parse(placed->body)["waiting_for"],
            nlohmann::json({"payment_confirmed", "payment_failed"}));
  EXPECT_EQ(ChargeStatus("dlv-1-order"), "requires_action");  // the child's key
  EXPECT_EQ(Shipments("dlv-1", "created"), 0);

  auto confirmed =
      test_support::Post(orch_, "/v1/runs/deliver_order/dlv-1/events/payment_confirmed",
                         test_support::Order("dlv-1-confirmed", "{}"));
  ASSERT_EQ(confirmed->status, 202) << confirmed->body;
  ASSERT_TRUE(
      test_support::WaitFor([&] { return RunView("dlv-1")["status"] == "completed"; }, 30s, 50ms))
      << RunView("dlv-1").dump();
  EXPECT_EQ(ChargeStatus("dlv-1-order"), "captured");
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 1);
  EXPECT_EQ(Shipments("dlv-1", "created"), 1);
  // The shipment is of the child's reservation, and the answer names all three.
  auto reservation =
      stack_.inv_db.Text("SELECT reservation_id FROM reservations WHERE idempotency_key = $1",
                         std::string("dlv-1-order-inventory"));
  EXPECT_EQ(stack_.ship_db.Text("SELECT reservation_id FROM shipments WHERE idempotency_key = $1",
                                std::string("dlv-1-shipping")),
            reservation);
  auto replay = Deliver("dlv-1", "pm_card_3ds");
  ASSERT_EQ(replay->status, 201) << replay->body;
  auto body = nlohmann::json::parse(replay->body);
  EXPECT_EQ(body["reservation_id"], reservation);
  EXPECT_EQ(body["idempotency_key"], "dlv-1");
  EXPECT_TRUE(body.contains("charge_id") && body.contains("shipment_id")) << replay->body;
  EXPECT_EQ(replay->body, RunView("dlv-1")["response"]["body"].dump());
  // The operator's reconciliation reads the child's calls in the parent's record: clean, and
  // a charge of the child undone behind the saga's back is found, under the child's key.
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
  stack_.pay_db.Exec(
      "UPDATE idempotency_keys SET compensated_at = now() WHERE idempotency_key = $1",
      std::string("dlv-1-order-payment"));
  report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  ASSERT_EQ(report.discrepancies.size(), 1U) << report.ToText();
  EXPECT_EQ(report.discrepancies[0].key, "dlv-1-order-payment");
  EXPECT_EQ(report.discrepancies[0].parent_key, "dlv-1");
  EXPECT_EQ(report.discrepancies[0].problem, "action_compensated");
}

// The shipment is refused after the child completed: compensating the delivery compensates
// the child, its charge refunded and its stock released.
TEST_F(Delivery, ARefusedShipmentUndoesTheCompletedChildOrder) {
  auto placed = Deliver("dlv-2", "pm_card_visa", "AQ");
  ASSERT_EQ(placed->status, 422) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "address_unserviceable");
  EXPECT_EQ(body["compensated"], nlohmann::json({"order"}));
  EXPECT_EQ(ChargeStatus("dlv-2-order"), "refunded");
  EXPECT_EQ(Reserved(), 0);
  EXPECT_EQ(Shipments("dlv-2", "created"), 0);
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
}

TEST_F(Delivery, AnOrderTheChildWouldRefuseIsRefusedAtTheRouteAndStoresNothing) {
  nlohmann::json order = nlohmann::json::parse(test_support::OrderPaidBy("pm_card_visa"));
  order.erase("currency");
  nlohmann::json body = {{"order", order},
                         {"address",
                          {{"name", "A"},
                           {"line1", "1 Road"},
                           {"city", "London"},
                           {"postal_code", "N1"},
                           {"country", "GB"}}}};
  auto r = test_support::Post(orch_, "/v1/runs/deliver_order",
                              test_support::Order("dlv-3", body.dump()));
  ASSERT_EQ(r->status, 400) << r->body;
  EXPECT_NE(nlohmann::json::parse(r->body)["detail"].get<std::string>().find("order: "),
            std::string::npos)
      << r->body;
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations"), 0);
}

// Over the approval limit: the child order completes (charged), then the delivery waits,
// parked, for an operator; an approval ships it, a rejection refunds and releases.
TEST_F(Delivery, AnOrderOverTheLimitWaitsForAnOperatorAndShipsOnlyWhenApproved) {
  const long long over = idemsaga::steps::kDeliveryApprovalOverCents + 1;
  auto placed = Deliver("dlv-4", "pm_card_visa", "GB", over);
  ASSERT_EQ(placed->status, 202) << placed->body;
  EXPECT_EQ(nlohmann::json::parse(placed->body)["waiting_for"],
            nlohmann::json({"order_approved", "order_rejected"}));
  EXPECT_EQ(ChargeStatus("dlv-4-order"), "captured");
  EXPECT_EQ(Shipments("dlv-4", "created"), 0);
  // A decision that names nobody, or with fields it does not read, is refused and stored not.
  for (const char* bad : {"{}", R"({"by":7})", R"({"by":""})", R"({"by":"a","why":"b"})"}) {
    auto r = Decide("dlv-4", "order_approved", bad);
    EXPECT_EQ(r->status, 400) << bad << " " << r->body;
  }
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM saga_events"), 0);
  // An event it does not await is refused naming every one it does, its child's included.
  auto unknown = Decide("dlv-4", "order_shipped", "{}");
  EXPECT_EQ(unknown->status, 409);
  EXPECT_NE(unknown->body.find("payment_confirmed, payment_failed, order_approved, order_rejected"),
            std::string::npos)
      << unknown->body;

  auto approved = Decide("dlv-4", "order_approved", R"({"by":"ops@example.com"})");
  ASSERT_EQ(approved->status, 202) << approved->body;
  ASSERT_TRUE(
      test_support::WaitFor([&] { return RunView("dlv-4")["status"] == "completed"; }, 30s, 50ms))
      << RunView("dlv-4").dump();
  EXPECT_EQ(Shipments("dlv-4", "created"), 1);
  EXPECT_EQ(ChargeStatus("dlv-4-order"), "captured");

  ASSERT_EQ(Deliver("dlv-5", "pm_card_visa", "GB", over)->status, 202);
  auto rejected =
      Decide("dlv-5", "order_rejected", R"({"by":"ops@example.com","reason":"fraud check"})");
  ASSERT_EQ(rejected->status, 202) << rejected->body;
  ASSERT_TRUE(
      test_support::WaitFor([&] { return RunView("dlv-5")["status"] == "failed"; }, 30s, 50ms));
  auto body = RunView("dlv-5")["response"]["body"];
  EXPECT_EQ(body["code"], "order_rejected");
  EXPECT_EQ(body["detail"], "fraud check");
  EXPECT_EQ(ChargeStatus("dlv-5-order"), "refunded");
  EXPECT_EQ(Shipments("dlv-5", "created"), 0);
  EXPECT_EQ(Reserved(), 2);  // dlv-4's, shipped; dlv-5's released

  // At the limit itself no operator is asked: the approval is skipped.
  auto at_limit =
      Deliver("dlv-6", "pm_card_visa", "GB", idemsaga::steps::kDeliveryApprovalOverCents);
  ASSERT_EQ(at_limit->status, 201) << at_limit->body;
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
}

}  // namespace
