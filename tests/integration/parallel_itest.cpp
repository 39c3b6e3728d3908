// place_order_parallel over real HTTP with the real participants: the stock is reserved and
// the card charged side by side, each under its own derived key; when one refuses, what the
// other applied is undone. Money is counted in the payment participant's table, stock in the
// inventory's.
#include <gtest/gtest.h>

#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;

class ParallelOrders : public ::testing::Test {
 protected:
  ParallelOrders()
      : stack_([](idemsaga::orchestrator::OrchestratorOptions& o) {
          o.recovery.sweep_interval = 100ms;
        }),
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
  auto placed = Place("par-1", test_support::OrderPaidBy("pm_card_visa"));
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
  auto again = Place("par-1", test_support::OrderPaidBy("pm_card_visa"));
  ASSERT_EQ(again->status, 201);
  EXPECT_EQ(again->body, placed->body);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations"), 1);
  auto report = stack_.orch.service.Reconcile(std::chrono::hours(1));
  EXPECT_TRUE(report.discrepancies.empty()) << report.ToText();
}

// The sibling answers late (participant latency), so the refusal finds it applied: it is
// undone, and nothing stays applied.
TEST_F(ParallelOrders, ADeclinedCardReleasesTheStockItsSiblingReserved) {
  stack_.payment.service.faults().Set({.latency_ms = 200});
  auto placed = Place("par-2", test_support::OrderPaidBy("pm_card_declined"));
  ASSERT_EQ(placed->status, 402) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "card_declined");
  EXPECT_EQ(body["compensated"], nlohmann::json({"inventory"}));
  EXPECT_EQ(Reservations("par-2", "released"), 1);
  EXPECT_EQ(Reserved("widget"), 0);
  EXPECT_EQ(ChargeStatus("par-2"), "none");
}

TEST_F(ParallelOrders, AnItemOutOfStockRefundsTheChargeItsSiblingMade) {
  stack_.inventory.service.faults().Set({.latency_ms = 200});
  auto placed = Place("par-3", test_support::OrderPaidBy("pm_card_visa", "gadget", 11));
  ASSERT_EQ(placed->status, 409) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "insufficient_stock");
  EXPECT_EQ(body["compensated"], nlohmann::json({"payment"}));
  EXPECT_EQ(ChargeStatus("par-3"), "refunded");
  EXPECT_EQ(Reserved("gadget"), 0);
  EXPECT_EQ(stack_.inv_db.Count("SELECT count(*) FROM reservations WHERE status = 'reserved'"), 0);
}

TEST_F(ParallelOrders, ACardThatNeeds3DSecureWaitsAfterBothStepsThenCaptures) {
  auto placed = Place("par-4", test_support::OrderPaidBy("pm_card_3ds"));
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
        std::string body = i % 3 == 0   ? test_support::OrderPaidBy("pm_card_declined")
                           : i % 3 == 1 ? test_support::OrderPaidBy("pm_card_visa", "gadget", 11)
                                        : test_support::OrderPaidBy("pm_card_visa");
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

// Compensations run in the reverse order the branches finished: the charge ended first, the
// reservation second, so the stock is released first. When that release is stuck and an
// operator resolves it by hand, the step resolved is the release (not the refund, which is
// last in the definition's order) and the saga then refunds the charge itself.
TEST(ParallelResolve, TheStepResolvedByHandIsTheStuckOneInTheOrderTheBranchesFinished) {
  test_support::Stack stack([](idemsaga::orchestrator::OrchestratorOptions& o) {
    o.recovery.sweep_interval = 100ms;
    o.retry.initial_backoff = 5ms;
    o.retry.max_backoff = 20ms;
    o.retry.compensation_stuck_after = 2;
    o.retry.stuck_retry_interval = 30s;
  });
  auto orch = stack.orch.Client();
  stack.inventory.service.faults().Set({.latency_ms = 150});  // the charge ends first
  auto placed =
      test_support::Post(orch, "/v1/runs/place_order_parallel",
                         test_support::Order("res-1", test_support::OrderPaidBy("pm_card_3ds")));
  ASSERT_EQ(placed->status, 202) << placed->body;
  stack.inventory.service.faults().Set({.error_rate = 1});  // the release cannot go through
  auto refused =
      test_support::Post(orch, "/v1/runs/place_order_parallel/res-1/events/payment_failed",
                         test_support::Order("res-1-failed", "{}"));
  ASSERT_EQ(refused->status, 202) << refused->body;
  auto view = [&] {
    auto r = orch.Get("/v1/runs/place_order_parallel/res-1",
                      httplib::Headers{{"Authorization", "Bearer dev-key-demo"}});
    return nlohmann::json::parse(r->body);
  };
  ASSERT_TRUE(test_support::WaitFor([&] { return view().value("stuck", false); }, 30s, 50ms))
      << view().dump();
  EXPECT_EQ(stack.ChargeStatus("res-1"), "requires_action");  // not refunded yet
  stack.inv_db.Exec("UPDATE reservations SET status = 'released', released_at = now()");  // the fix
  auto resolved = orch.Post(
      "/v1/sagas/res-1/resolve", httplib::Headers{{"Authorization", "Bearer dev-key-demo"}},
      R"({"note":"released by hand","operator":"alice"})", "application/json");
  ASSERT_EQ(resolved->status, 202) << resolved->body;
  EXPECT_EQ(nlohmann::json::parse(resolved->body)["step"], "inventory");
  stack.inventory.service.faults().Set({});
  ASSERT_TRUE(test_support::WaitFor([&] { return view()["status"] == "failed"; }, 30s, 50ms))
      << view().dump();
  EXPECT_EQ(stack.ChargeStatus("res-1"), "refunded");
}

}  // namespace
