// A saga of a user's own whose steps are child sagas: two orders placed as one, each the
// shipped place_order (v1) under its own derived key, over real HTTP with the real
// participants. Money and stock are counted in the participants' tables.
#include <gtest/gtest.h>

#include "steps/place_order.hpp"
#include "tests/support/stack.hpp"

namespace {

using namespace std::chrono_literals;

// {"first": order, "second": order}: both placed, or neither kept.
std::optional<idemsaga::steps::saga::Definition> TwoOrders(idemsaga::Participants& p) {
  auto order = [&p] {
    return idemsaga::steps::MakePlaceOrderSagaV1(p.Get("inventory"), p.Get("payment"));
  };
  auto part = [](const char* which) {
    return [which](const idemsaga::steps::saga::StepContext& ctx) { return (*ctx.request)[which]; };
  };
  idemsaga::steps::saga::Definition d("two_orders");
  d.Child("first", order(), part("first"))
      .Child("second", order(), part("second"))
      .Answer([](const idemsaga::steps::saga::StepContext& ctx) {
        return idemsaga::steps::saga::SuccessAnswer{
            201,
            {{"status", "completed"},
             {"charges",
              {ctx.Output("first")["outputs"]["payment"]["charge_id"],
               ctx.Output("second")["outputs"]["payment"]["charge_id"]}}}};
      });
  return d;
}

class ChildSagas : public ::testing::Test {
 protected:
  ChildSagas()
      : stack_({},
               [] {
                 auto sagas = idemsaga::steps::ShippedSagas();
                 sagas.push_back(TwoOrders);
                 return sagas;
               }()),
        orch_(stack_.orch.Client()) {}

  httplib::Result Place(const std::string& key, const std::string& second) {
    return test_support::Post(
        orch_, "/v1/runs/two_orders",
        test_support::Order(key, R"({"first":)" + test_support::OrderPaidBy("pm_card_visa") +
                                     R"(,"second":)" + test_support::OrderPaidBy(second) + "}"));
  }
  long long Reservations(const std::string& key, const std::string& status) {
    return stack_.inv_db.Count(
        "SELECT count(*) FROM reservations WHERE idempotency_key = $1 AND status = $2", key,
        status);
  }

  test_support::Stack stack_;
  httplib::Client orch_;
};

TEST_F(ChildSagas, BothChildrenRunUnderTheirOwnKeysAndTheParentAnswersWhatItDeclares) {
  auto placed = Place("two-1", "pm_card_visa");
  ASSERT_EQ(placed->status, 201) << placed->body;
  EXPECT_EQ(stack_.ChargeStatus("two-1-first"), "captured");
  EXPECT_EQ(stack_.ChargeStatus("two-1-second"), "captured");
  EXPECT_EQ(Reservations("two-1-first-inventory", "reserved"), 1);
  EXPECT_EQ(Reservations("two-1-second-inventory", "reserved"), 1);
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["charges"][0],
            stack_.pay_db.Text("SELECT charge_id FROM charges WHERE idempotency_key = $1",
                               std::string("two-1-first-payment")));
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 2);
  auto again = Place("two-1", "pm_card_visa");
  EXPECT_EQ(again->body, placed->body);
  EXPECT_EQ(stack_.pay_db.Count("SELECT count(*) FROM charges"), 2);
}

// The second child is declined: it releases its own stock; then the parent undoes the first
// child, a completed order: its charge refunded, its stock released. Nothing stays applied.
TEST_F(ChildSagas, AFailedSecondChildUndoesItselfAndTheParentUndoesTheFirst) {
  auto placed = Place("two-2", "pm_card_declined");
  ASSERT_EQ(placed->status, 402) << placed->body;
  auto body = nlohmann::json::parse(placed->body);
  EXPECT_EQ(body["code"], "card_declined");
  EXPECT_EQ(body["step"], "second");
  EXPECT_EQ(body["compensated"], nlohmann::json({"first"}));
  EXPECT_EQ(stack_.ChargeStatus("two-2-first"), "refunded");
  EXPECT_EQ(stack_.ChargeStatus("two-2-second"), "none");
  EXPECT_EQ(Reservations("two-2-first-inventory", "released"), 1);
  EXPECT_EQ(Reservations("two-2-second-inventory", "released"), 1);
  EXPECT_EQ(stack_.inv_db.Count("SELECT coalesce(sum(reserved), 0) FROM stock"), 0);
}

}  // namespace
