// Durable waits over real HTTP and a real PostgreSQL: a saga of the test's own reserves stock,
// waits for an approval event when the amount is over a limit (a condition), sleeps on a
// durable timer, then charges. Each wait parks the saga (no thread held); a delivered event
// or the timer wakes it through recovery; an event storm delivers exactly once; refused
// events store nothing; a wait that times out compensates.
#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "steps/place_order.hpp"
#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;

constexpr auto kApprovalTimeout = 6s;

std::optional<idemsaga::steps::saga::Definition> ApproveOrder(idemsaga::Participants& p) {
  auto& inventory = p.Get("inventory");
  auto& payment = p.Get("payment");
  idemsaga::steps::saga::Definition d("approve_order");
  d.Step("inventory", idemsaga::steps::ReserveItems(inventory),
         idemsaga::steps::ReleaseItems(inventory))
      .Await("approval",
             {.events = {"approved", "rejected"},
              .timeout = kApprovalTimeout,
              .validate =
                  [](const std::string&, const nlohmann::json& payload) {
                    if (!payload.is_object() || !payload.contains("approver") ||
                        !payload["approver"].is_string()) {
                      throw idemsaga::steps::saga::InvalidInput("approver must be a string");
                    }
                  },
              .decide =
                  [](const std::string& event, const nlohmann::json& payload,
                     const idemsaga::steps::saga::StepContext&) {
                    if (event == "rejected") {
                      return idemsaga::steps::saga::StepResult::Terminal(
                          422, "order_rejected",
                          "rejected by " + payload["approver"].get<std::string>());
                    }
                    return idemsaga::steps::saga::StepResult::Succeeded(
                        {{"approver", payload["approver"]}});
                  }})
      .When([](const idemsaga::steps::saga::StepContext& ctx) {
        return (*ctx.request)["amount_cents"].get<long long>() > 100000;
      })
      .Sleep("cool_off", 2500ms)
      .Step("payment", idemsaga::steps::ChargeOrder(payment),
            idemsaga::steps::RefundOrder(payment));
  return d;
}

std::string Body(long long amount_cents) {
  return R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":2}],"amount_cents":)" +
         std::to_string(amount_cents) + R"(,"currency":"USD","payment_method":"pm_card_visa"})";
}

void ExpectProblem(const httplib::Result& r, int status, const std::string& code) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, status) << r->body;
  EXPECT_EQ(test_support::ErrorCode(r), code);
}

class Events : public ::testing::Test {
 protected:
  Events()
      : stack_(
            [](idemsaga::orchestrator::OrchestratorOptions& o) {
              o.sagas.response_budget = 1s;  // the timer outlives it: parked
              o.recovery.sweep_interval = 100ms;
            },
            [] {
              auto sagas = idemsaga::steps::ShippedSagas();
              sagas.push_back(ApproveOrder);
              return sagas;
            }()),
        orch_(stack_.orch.Client()) {}

  httplib::Result Start(const std::string& key, long long amount_cents) {
    return test_support::Post(orch_, "/v1/runs/approve_order",
                              test_support::Order(key, Body(amount_cents)));
  }
  httplib::Result Event(const std::string& run, const std::string& name,
                        const std::string& event_key, const std::string& body,
                        const std::string& api_key = "dev-key-demo",
                        const std::string& saga = "approve_order") {
    return test_support::Post(orch_, "/v1/runs/" + saga + "/" + run + "/events/" + name,
                              test_support::Order(event_key, body, api_key));
  }
  nlohmann::json View(const std::string& run) {
    auto r = orch_.Get("/v1/runs/approve_order/" + run,
                       httplib::Headers{{"Authorization", "Bearer dev-key-demo"}});
    return nlohmann::json::parse(r->body);
  }
  bool Ended(const std::string& run, const std::string& status, std::chrono::seconds within) {
    return test_support::WaitFor([&] { return View(run)["status"] == status; }, within, 50ms);
  }
  long long Charges(const std::string& run) {
    return stack_.pay_db.Count("SELECT count(*) FROM charges WHERE idempotency_key = $1",
                               run + "-payment");
  }
  long long Reserved(const std::string& run) {
    return stack_.inv_db.Count(
        "SELECT count(*) FROM reservations WHERE idempotency_key = $1 AND status = 'reserved'",
        run + "-inventory");
  }
  long long StoredEvents() { return stack_.orch_db.Count("SELECT count(*) FROM saga_events"); }

  test_support::Stack stack_;
  httplib::Client orch_;
};

TEST_F(Events, AnApprovalEventWakesTheParkedRunWhichSleepsThenChargesOnce) {
  auto started = Start("big-1", 250000);
  ASSERT_EQ(started->status, 202) << started->body;
  auto accepted = nlohmann::json::parse(started->body);
  EXPECT_EQ(accepted["waiting_for"], nlohmann::json({"approved", "rejected"}));
  auto view = View("big-1");
  EXPECT_EQ(view["waiting_for"], nlohmann::json({"approved", "rejected"}));
  EXPECT_EQ(view["steps"][1]["status"], "waiting");
  EXPECT_EQ(Reserved("big-1"), 1);

  auto delivered = Event("big-1", "approved", "ev-1", R"({"approver":"ann"})");
  ASSERT_EQ(delivered->status, 202) << delivered->body;
  EXPECT_EQ(delivered->get_header_value("Location"), "/v1/runs/approve_order/big-1");
  // A retry of the delivery replays its answer byte for byte.
  auto again = Event("big-1", "approved", "ev-1", R"({"approver":"ann"})");
  EXPECT_EQ(again->status, 202);
  EXPECT_EQ(again->body, delivered->body);

  ASSERT_TRUE(Ended("big-1", "completed", 30s)) << View("big-1").dump();
  view = View("big-1");
  EXPECT_EQ(view["steps"][1]["status"], "succeeded");
  EXPECT_EQ(view["steps"][2]["status"], "succeeded");  // the timer fired
  EXPECT_FALSE(view.contains("waiting_for"));
  EXPECT_EQ(Charges("big-1"), 1);
  EXPECT_EQ(Reserved("big-1"), 1);
  // The run's own key replays the stored 201.
  auto replay = Start("big-1", 250000);
  EXPECT_EQ(replay->status, 201) << replay->body;
  // The run has moved past the wait: a new delivery is refused and stores nothing.
  ExpectProblem(Event("big-1", "rejected", "ev-2", R"({"approver":"bob"})"), 409,
                "event_not_accepted");
  EXPECT_EQ(StoredEvents(), 1);
}

TEST_F(Events, AnEventStormDeliversOnceAndStoresNothingForTheRefusedOnes) {
  ASSERT_EQ(Start("storm-1", 250000)->status, 202);
  ASSERT_EQ(test_support::Post(orch_, "/v1/orders", test_support::Order("plain-1"))->status, 201);

  std::mutex mutex;
  std::map<std::string, int> outcomes;  // status + code
  std::set<std::string> accepted_bodies;
  std::vector<std::thread> senders;
  for (int i = 0; i < 50 + 20 + 20; ++i) {
    senders.emplace_back([&, i] {
      auto client = stack_.orch.Client();
      auto send = [&](const std::string& path, const std::string& key, const std::string& body) {
        return test_support::Post(client, path, test_support::Order(key, body));
      };
      auto r = i < 50  // one delivery, sent 50 times at once
                   ? send("/v1/runs/approve_order/storm-1/events/approved", "same",
                          R"({"approver":"ann"})")
                   : i < 70  // the same event under other keys
                         ? send("/v1/runs/approve_order/storm-1/events/approved",
                                "other-" + std::to_string(i), R"({"approver":"eve"})")
                         // events for a run that waits for none
                         : send("/v1/runs/place_order/plain-1/events/approved",
                                "x-" + std::to_string(i), R"({"approver":"eve"})");
      std::lock_guard lock(mutex);
      if (!r) {
        ++outcomes["no answer"];
        return;
      }
      std::string code = r->status < 300 ? "" : test_support::ErrorCode(r);
      ++outcomes[std::to_string(r->status) + " " + code];
      if (r->status == 202) accepted_bodies.insert(r->body);
    });
  }
  for (auto& t : senders) t.join();
  std::cout << "event storm:";
  for (const auto& [o, n] : outcomes) std::cout << " [" << o << "]=" << n;
  std::cout << std::endl;
  EXPECT_EQ(outcomes["202 "], 50);
  EXPECT_EQ(accepted_bodies.size(), 1u);
  EXPECT_EQ(outcomes["409 event_already_received"], 20);
  EXPECT_EQ(outcomes["409 event_not_expected"], 20);
  EXPECT_EQ(StoredEvents(), 1);
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM saga_events WHERE event_key = 'same' AND "
                                 "payload = '{\"approver\":\"ann\"}'"),
            1);
  ASSERT_TRUE(Ended("storm-1", "completed", 30s));
  EXPECT_EQ(Charges("storm-1"), 1);
}

TEST_F(Events, HostileDeliveriesAreRefusedWithA4xxAndStoreNothing) {
  ASSERT_EQ(Start("hostile-1", 250000)->status, 202);
  struct Case {
    std::string path, key, body, api_key;
    int status;
    std::string code;
  };
  const std::string run = "/v1/runs/approve_order/hostile-1/events/";
  std::vector<Case> cases = {
      {run + "approved", "k1", R"({"approver":7})", "dev-key-demo", 400, "invalid_request"},
      {run + "approved", "k2", R"({})", "dev-key-demo", 400, "invalid_request"},
      {run + "approved", "k3", R"({"approver":)", "dev-key-demo", 400, "invalid_json"},
      {run + "approved", "k4", "{\"approver\":\"a\\u0000b\"}", "dev-key-demo", 400, "invalid_json"},
      {run + "approved", "", R"({"approver":"ann"})", "dev-key-demo", 400,
       "idempotency_key_missing"},
      {run + "approved", "k5", R"({"approver":"ann"})", "wrong-key", 401, "unauthorized"},
      // Another tenant's run is no run at all.
      {run + "approved", "k6", R"({"approver":"ann"})", "dev-key-acme", 404, "not_found"},
      {run + "shipped", "k7", R"({"approver":"ann"})", "dev-key-demo", 409, "event_not_expected"},
      {run + "Approved", "k8", R"({"approver":"ann"})", "dev-key-demo", 409, "event_not_expected"},
      {run + "approved%2F..", "k9", R"({"approver":"ann"})", "dev-key-demo", 409,
       "event_not_expected"},
      {"/v1/runs/place_order/hostile-1/events/approved", "k10", R"({"approver":"ann"})",
       "dev-key-demo", 404, "not_found"},
      {"/v1/runs/approve_order/nope/events/approved", "k11", R"({"approver":"ann"})",
       "dev-key-demo", 404, "not_found"},
  };
  for (const auto& c : cases) {
    auto r = test_support::Post(orch_, c.path, test_support::Order(c.key, c.body, c.api_key));
    ASSERT_TRUE(r) << c.path;
    EXPECT_EQ(r->status, c.status) << c.path << " " << c.body << " -> " << r->body;
    if (c.status != 401) {
      EXPECT_EQ(test_support::ErrorCode(r), c.code) << c.path;
    }
  }
  // Generated: every byte of a short event name and of a key suffix; none is a 5xx.
  int fivexx = 0;
  for (int b = 1; b < 256; ++b) {
    char c = static_cast<char>(b);
    std::string name = "%" + std::string(1, "0123456789ABCDEF"[b / 16]) +
                       std::string(1, "0123456789ABCDEF"[b % 16]);
    auto r = test_support::Post(
        orch_, run + name, test_support::Order("g" + std::to_string(b), R"({"approver":"x"})"));
    if (!r || r->status >= 500) ++fivexx;
    auto k = test_support::Post(orch_, run + "approved",
                                test_support::Order(std::string("g-") + c, R"({"approver":7})"));
    if (!k || k->status >= 500) ++fivexx;
  }
  EXPECT_EQ(fivexx, 0);
  EXPECT_EQ(StoredEvents(), 0);
  EXPECT_EQ(View("hostile-1")["status"], "started");
}

TEST_F(Events, AWaitThatTimesOutFailsTheRunAndReleasesTheStockWithoutCharging) {
  ASSERT_EQ(Start("late-1", 250000)->status, 202);
  ASSERT_TRUE(Ended("late-1", "failed", kApprovalTimeout + 20s)) << View("late-1").dump();
  auto view = View("late-1");
  EXPECT_EQ(view["failed_step"], "approval");
  EXPECT_EQ(view["response"]["status"], 409);
  EXPECT_EQ(view["response"]["body"]["code"], "event_timeout");
  EXPECT_EQ(view["response"]["body"]["compensated"], nlohmann::json({"inventory"}));
  EXPECT_EQ(Reserved("late-1"), 0);
  EXPECT_EQ(Charges("late-1"), 0);
  ExpectProblem(Event("late-1", "approved", "ev-late", R"({"approver":"ann"})"), 409,
                "event_not_accepted");
  EXPECT_EQ(StoredEvents(), 0);
}

TEST_F(Events, ARejectionCompensatesAndTheRunsKeyReplaysTheRefusal) {
  ASSERT_EQ(Start("no-1", 250000)->status, 202);
  ASSERT_EQ(Event("no-1", "rejected", "ev-no", R"({"approver":"bob"})")->status, 202);
  ASSERT_TRUE(Ended("no-1", "failed", 30s));
  auto replay = Start("no-1", 250000);
  EXPECT_EQ(replay->status, 422);
  EXPECT_EQ(test_support::ErrorCode(replay), "order_rejected");
  EXPECT_EQ(Reserved("no-1"), 0);
  EXPECT_EQ(Charges("no-1"), 0);
}

TEST_F(Events, BelowTheLimitTheApprovalIsSkippedAndOnlyTheTimerWaits) {
  auto started = Start("small-1", 500);
  ASSERT_EQ(started->status, 202) << started->body;  // parked on the timer
  EXPECT_FALSE(nlohmann::json::parse(started->body).contains("waiting_for"));
  ASSERT_TRUE(Ended("small-1", "completed", 30s));
  auto view = View("small-1");
  EXPECT_EQ(view["steps"][1]["status"], "skipped");
  EXPECT_EQ(Charges("small-1"), 1);
}

TEST_F(Events, AnEventDeliveredBeforeTheRunReachesItsWaitIsKept) {
  // Inventory answers after 1.5 s: the event comes while the run is still reserving.
  stack_.inventory.service.faults().Set({.latency_ms = 1500});
  auto run = std::async(std::launch::async, [&] {
    auto c = stack_.orch.Client();
    return test_support::Post(c, "/v1/runs/approve_order",
                              test_support::Order("early-1", Body(250000)));
  });
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        auto delivered = Event("early-1", "approved", "ev-early", R"({"approver":"ann"})");
        return delivered && delivered->status == 202;
      },
      10s, 1ms));
  // Delivered while the run was still in its first step: it had parked nowhere yet.
  EXPECT_TRUE(View("early-1")["steps"].empty()) << View("early-1").dump();
  run.get();
  ASSERT_TRUE(Ended("early-1", "completed", 30s));
  EXPECT_EQ(View("early-1")["steps"][1]["status"], "succeeded");
  EXPECT_EQ(Charges("early-1"), 1);
}

TEST_F(Events, ACancelWakesAParkedRunAtOnceAndItCompensates) {
  ASSERT_EQ(Start("cancel-1", 250000)->status, 202);
  auto cancel = orch_.Post("/v1/sagas/cancel-1/cancel",
                           httplib::Headers{{"Authorization", "Bearer dev-key-demo"}},
                           R"({"reason":"customer called"})", "application/json");
  ASSERT_EQ(cancel->status, 202) << cancel->body;
  // Well before the approval would time out.
  auto asked = std::chrono::steady_clock::now();
  ASSERT_TRUE(Ended("cancel-1", "failed", 30s));
  EXPECT_LT(std::chrono::steady_clock::now() - asked, kApprovalTimeout);
  EXPECT_EQ(View("cancel-1")["response"]["body"]["code"], "saga_cancelled");
  EXPECT_EQ(Reserved("cancel-1"), 0);
  EXPECT_EQ(Charges("cancel-1"), 0);
}

}  // namespace
