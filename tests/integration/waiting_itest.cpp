// Waiting costs no thread: with the payment participant answering 503 + Retry-After to every
// call, a storm of orders is answered at once (202: the sagas are parked, checkpointed, or
// queued for a thread, durably), replays of a finished order keep answering, nothing is a
// 503, and once payment recovers every saga completes exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "steps/place_order.hpp"
#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(Waiting, AParticipantOutageParksItsSagasAndHoldsUpNothingElse) {
  test_support::Stack stack([](idemsaga::orchestrator::OrchestratorOptions& o) {
    o.sagas.threads = 4;       // far fewer than the sagas that wait
    o.sagas.inline_limit = 2;  // these two sleep through the budget, then park
    o.sagas.response_budget = 2s;
    o.recovery.sweep_interval = 200ms;
  });
  auto orch = stack.orch.Client();
  auto done = test_support::Post(orch, "/v1/orders", test_support::Order("done-1"));
  ASSERT_EQ(done->status, 201) << done->body;
  stack.payment.service.faults().Set({.error_rate = 1.0});  // 503 + Retry-After: 1

  constexpr int kClients = 12, kEach = 5;
  std::mutex mutex;
  std::map<int, int> statuses;
  long long slowest_ms = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto client = stack.orch.Client();
      for (int i = 0; i < kEach; ++i) {
        auto started = Clock::now();
        auto r = test_support::Post(
            client, "/v1/orders",
            test_support::Order("wait-" + std::to_string(c) + "-" + std::to_string(i)));
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
        std::lock_guard lock(mutex);
        ++statuses[r ? r->status : 0];
        slowest_ms = std::max<long long>(slowest_ms, ms.count());
      }
    });
  }
  // Meanwhile a finished order replays, untouched by the outage.
  int replays = 0, replay_mismatches = 0;
  while (replays < 50) {
    auto r = test_support::Post(orch, "/v1/orders", test_support::Order("done-1"));
    ++replays;
    if (!r || r->status != 201 || r->body != done->body) ++replay_mismatches;
  }
  for (auto& t : clients) t.join();
  std::cout << "waiting: orders=" << kClients * kEach << " slowest_ms=" << slowest_ms;
  for (const auto& [status, n] : statuses) std::cout << " " << status << "=" << n;
  std::cout << " replays=" << replays << " replay_mismatches=" << replay_mismatches << std::endl;
  EXPECT_EQ(statuses[202], kClients * kEach);  // accepted, none refused, none held
  EXPECT_EQ(replay_mismatches, 0);
  // No request was held past its response budget (2 s) by a saga that can only wait; before
  // waits were parked, most were held that long and then refused with 503 at capacity.
  EXPECT_LT(slowest_ms, 10000);

  // Parked: started, not stuck, with the payment step's attempts checkpointed.
  EXPECT_GT(stack.orch_db.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'started' "
                                "AND NOT stuck AND steps::text LIKE '%first_attempt_unix_ms%'"),
            0);

  stack.payment.service.faults().Set({});
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        return stack.orch_db.Count(
                   "SELECT count(*) FROM idempotency_keys WHERE status = 'completed'") ==
               kClients * kEach + 1;
      },
      90s))
      << stack.orch_db.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'");
  // Exactly one charge and one reservation per order, whatever was parked and resumed.
  EXPECT_EQ(stack.pay_db.Count("SELECT count(*) FROM charges"), kClients * kEach + 1);
  EXPECT_EQ(stack.pay_db.Count("SELECT count(DISTINCT idempotency_key) FROM charges"),
            kClients * kEach + 1);
  EXPECT_EQ(stack.inv_db.Count("SELECT count(*) FROM reservations"), kClients * kEach + 1);
  // The stored answer of a parked order is its 201.
  auto later = test_support::Post(orch, "/v1/orders", test_support::Order("wait-0-0"));
  ASSERT_TRUE(later);
  EXPECT_EQ(later->status, 201) << later->body;
}

// A bulkhead: payment answers after 1.5 s and takes two calls at a time from this
// orchestrator. Orders pile up behind it, yet they hold no server worker (a saga past the
// inline limit runs on the pool, its answer sent when it ends; one turned away by the
// bulkhead parks at once), so a saga that never calls payment is served all along: every one
// answers 201, and nothing anywhere is a 503.
TEST(Waiting, ASlowParticipantDelaysOnlyTheSagasThatCallIt) {
  auto reserve_only =
      [](idemsaga::Participants& p) -> std::optional<idemsaga::steps::saga::Definition> {
    idemsaga::steps::saga::Definition d("reserve_only");
    d.Step("inventory", idemsaga::steps::ReserveItems(p.Get("inventory")),
           idemsaga::steps::ReleaseItems(p.Get("inventory")));
    return d;
  };
  auto sagas = idemsaga::steps::ShippedSagas();
  sagas.push_back(reserve_only);
  test_support::Stack stack(
      [](idemsaga::orchestrator::OrchestratorOptions& o) {
        o.limits.threads = 4;      // server workers: few, so a held one shows
        o.sagas.inline_limit = 3;  // of 4, as the defaults have 24 of 32
        o.sagas.threads = 8;
        o.sagas.response_budget = 3s;
        o.participant_max_in_flight = 2;
        o.recovery.sweep_interval = 200ms;
      },
      sagas);
  stack.payment.service.faults().Set({.latency_ms = 1500});

  constexpr int kOrders = 12, kReservations = 20;
  std::mutex mutex;
  std::map<int, int> order_statuses, reserve_statuses;
  std::vector<std::thread> clients;
  for (int c = 0; c < kOrders; ++c) {
    clients.emplace_back([&, c] {
      auto client = stack.orch.Client();
      auto r = test_support::Post(client, "/v1/orders",
                                  test_support::Order("slow-" + std::to_string(c)));
      std::lock_guard lock(mutex);
      ++order_statuses[r ? r->status : 0];
    });
  }
  std::this_thread::sleep_for(300ms);  // the orders are out, in payment or turned away
  auto client = stack.orch.Client();
  for (int i = 0; i < kReservations; ++i) {
    auto r =
        test_support::Post(client, "/v1/runs/reserve_only",
                           test_support::Order("fast-" + std::to_string(i),
                                               R"({"items":[{"sku":"widget","quantity":1}]})"));
    ++reserve_statuses[r ? r->status : 0];
  }
  for (auto& t : clients) t.join();
  std::cout << "bulkhead: orders";
  for (const auto& [status, n] : order_statuses) std::cout << " " << status << "=" << n;
  std::cout << " reservations";
  for (const auto& [status, n] : reserve_statuses) std::cout << " " << status << "=" << n;
  std::cout << std::endl;
  EXPECT_EQ(reserve_statuses[201], kReservations);
  EXPECT_EQ(order_statuses[201] + order_statuses[202], kOrders);

  stack.payment.service.faults().Set({});
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        return stack.orch_db.Count(
                   "SELECT count(*) FROM idempotency_keys WHERE status = "
                   "'completed' AND idempotency_key LIKE 'slow-%'") == kOrders;
      },
      60s));
  EXPECT_EQ(stack.pay_db.Count("SELECT count(*) FROM charges"), kOrders);
}

}  // namespace
