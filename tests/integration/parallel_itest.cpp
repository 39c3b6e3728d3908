// place_order_parallel over real HTTP with the real participants: the stock is reserved and
// the card charged side by side, each under its own derived key; when one refuses, what the
// other applied is undone. Money is counted in the payment participant's table, stock in the
// inventory's.
#include <gtest/gtest.h>

#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;

std::string Order(const std::string& method, const std::string& sku = "widget", int quantity = 2) {
  return R"({"customer_id":"cust_1","items":[{"sku":")" + sku + R"(","quantity":)" +
         std::to_string(quantity) +
         R"(}],"amount_cents":2500,"currency":"USD","payment_method":")" + method + R"("})";
}

class ParallelOrders : public ::testing::Test {
 protected:
  ParallelOrders()
      : stack_([](orchestrator::OrchestratorOptions& o) { o.recovery.sweep_interval = 100ms; }),
        orch_(stack_.orch.Client()) {}

  httplib::Result Place(const std::string& key, const std::string& body) {
    return test_support::Post(orch_, "/v1/runs/place_order_parallel",
                              test_support::Order(key, body));
  }
  nlohmann::json View(const std::string& key) {
    auto r = orch_.Get("/v1/runs/place_order_parallel/" + key,
                       httplib::Headers{{"Authorization", "Bearer dev-key-demo"}});
    return nlohmann::json::parse(r->body);
  }
  std::string ChargeStatus(const std::string& key) { return stack_.ChargeStatus(key); }
  long long Reservations(const std::string& key, const std::string& status) {
    return stack_.inv_db.Count(
        "SELECT count(*) FROM reservations WHERE idempotency_key = $1 AND status = $2",
        key + "-inventory", status);
  }
  long long Reserved(const std::string& sku) {
    return stack_.inv_db.Count("SELECT reserved FROM stock WHERE sku = $1", sku);
  }

  test_support::Stack stack_;
  httplib::Client orch_;
};

TEST_F(ParallelOrders, BothStepsRunUnderTheirOwnKeysAndTheOrderCompletesOnce) {
  auto placed = Place("par-1", Order("pm_card_visa"));
  ASSERT_EQ(placed->status, 201) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["status"], "completed");
  EXPECT_EQ(body["reservation_id"].get<std::string>().rfind("res_", 0), 0u);
  EXPECT_EQ(body["charge_id"].get<std::string>().rfind("ch_", 0), 0u);
  EXPECT_EQ(Reservations("par-1", "reserved"), 1);
  EXPECT_EQ(ChargeStatus("par-1"), "captured");
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 1);
  EXPECT_EQ(Reserved("widget"), 2);
  auto view = View("par-1");
  EXPECT_EQ(view["steps"][0]["derived_key"], "par-1-inventory");
  EXPECT_EQ(view["steps"][1]["derived_key"], "par-1-payment");
  EXPECT_EQ(view["steps"][2]["status"], "skipped");  // no 3-D Secure for this card
  // A retry is the stored answer, byte for byte, and sends nothing.
  auto again = Place("par-1", Order("pm_card_visa"));
  ASSERT_EQ(again->status, 201);
  EXPECT_EQ(again->body, placed->body);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations"), 1);
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
}

// The refusal may come before the sibling was sent (then there is nothing to undo) or after
// (then it is undone): either way nothing stays applied, and the answer says which it was.
TEST_F(ParallelOrders, ADeclinedCardReleasesTheStockItsSiblingReserved) {
  auto placed = Place("par-2", Order("pm_card_declined"));
  ASSERT_EQ(placed->status, 402) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "card_declined");
  const bool reserved = body["compensated"] == nlohmann::json({"inventory"});
  EXPECT_TRUE(reserved || body["compensated"].empty()) << body.dump();
  EXPECT_EQ(Reservations("par-2", "released"), reserved ? 1 : 0);
  EXPECT_EQ(Reservations("par-2", "reserved"), 0);
  EXPECT_EQ(Reserved("widget"), 0);
  EXPECT_EQ(ChargeStatus("par-2"), "none");
}

TEST_F(ParallelOrders, AnItemOutOfStockRefundsTheChargeItsSiblingMade) {
  auto placed = Place("par-3", Order("pm_card_visa", "gadget", 11));
  ASSERT_EQ(placed->status, 409) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "insufficient_stock");
  const bool charged = body["compensated"] == nlohmann::json({"payment"});
  EXPECT_TRUE(charged || body["compensated"].empty()) << body.dump();
  EXPECT_EQ(ChargeStatus("par-3"), charged ? "refunded" : "none");
  EXPECT_EQ(Reserved("gadget"), 0);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations WHERE status = 'reserved'"), 0);
}

TEST_F(ParallelOrders, ACardThatNeeds3DSecureWaitsAfterBothStepsThenCaptures) {
  auto placed = Place("par-4", Order("pm_card_3ds"));
  ASSERT_EQ(placed->status, 202) << placed->body;
  EXPECT_EQ(ChargeStatus("par-4"), "requires_action");
  EXPECT_EQ(Reservations("par-4", "reserved"), 1);
  auto confirmed =
      test_support::Post(orch_, "/v1/runs/place_order_parallel/par-4/events/payment_confirmed",
                         test_support::Order("par-4-confirmed", "{}"));
  ASSERT_EQ(confirmed->status, 202) << confirmed->body;
  ASSERT_TRUE(
      test_support::WaitFor([&] { return View("par-4")["status"] == "completed"; }, 30s, 50ms))
      << View("par-4").dump();
  EXPECT_EQ(ChargeStatus("par-4"), "captured");
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                                "'par-4-capture'"),
            1);
}

// Many orders at once, a third of them declined and a third out of stock: every one ends with
// its money and stock settled (no charge left on a failed order, no stock held by one).
TEST_F(ParallelOrders, ConcurrentOrdersEachSettleTheirMoneyAndStock) {
  constexpr int kOrders = 60;
  std::vector<std::thread> clients;
  std::vector<int> statuses(kOrders);
  for (int t = 0; t < 6; ++t) {
    clients.emplace_back([&, t] {
      httplib::Client c = stack_.orch.Client();
      for (int i = t; i < kOrders; i += 6) {
        std::string body = i % 3 == 0   ? Order("pm_card_declined")
                           : i % 3 == 1 ? Order("pm_card_visa", "gadget", 11)
                                        : Order("pm_card_visa");
        auto r = test_support::Post(c, "/v1/runs/place_order_parallel",
                                    test_support::Order("many-" + std::to_string(i), body));
        statuses[i] = r ? r->status : -1;
      }
    });
  }
  for (auto& c : clients) c.join();
  for (int i = 0; i < kOrders; ++i) {
    EXPECT_EQ(statuses[i], i % 3 == 0 ? 402 : i % 3 == 1 ? 409 : 201) << i;
  }
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges WHERE status = 'captured'"),
            kOrders / 3);
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges WHERE status NOT IN "
                                "('captured', 'refunded')"),
            0);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations WHERE status = 'reserved'"),
            kOrders / 3);
  EXPECT_EQ(Reserved("widget"), 2 * kOrders / 3);
  EXPECT_EQ(Reserved("gadget"), 0);
}

}  // namespace
