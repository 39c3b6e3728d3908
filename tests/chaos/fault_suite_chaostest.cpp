// The fault suite: real processes, one PostgreSQL, faults injected; after the faults stop,
// every saga must end, and the invariants must hold (see chaos_harness.hpp):
//   I1 at most one net reservation, charge and shipment per (tenant, key); I2 completed ->
//   exactly one of each its saga makes (place_order: no shipment), failed -> none; I3 every
//   saga terminal; I4 every 2xx matches a completed saga, byte for byte; I5 no cross-tenant
//   reads; I6 no effect without a parent accounting for it.
// Most scenarios mix place_order (inventory, payment) with ship_order (inventory, payment,
// shipping), whose refusal at its last step undoes two steps. Each scenario prints one summary
// line of figures.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <pqxx/pqxx>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/metrics_text.hpp"
#include "tests/support/wait.hpp"

namespace {

using chaos::Driver;
using chaos::KeyRecord;
using chaos::OrderBody;
using chaos::Settle;
using chaos::ShipOrderBody;
using chaos::Stack;
using Clock = std::chrono::steady_clock;

// I3's bound once faults stop, as chaos::Settle's.
constexpr auto kSettle = std::chrono::seconds(60);
// How long a scenario waits for a state it brings about (a saga mid-step, a takeover, the
// database seen down) before it goes on regardless; generous for sanitizer builds.
constexpr auto kStateTimeout = std::chrono::seconds(30);
// How often such a wait asks a database or a /metrics endpoint.
constexpr auto kPoll = std::chrono::milliseconds(100);

std::vector<KeyRecord> MakeOrders(const std::string& prefix, int n, int declined_every = 4,
                                  const std::string& tenant = "demo") {
  std::vector<KeyRecord> out;
  for (int i = 0; i < n; ++i) {
    bool declined = declined_every > 0 && i % declined_every == declined_every - 1;
    out.push_back({tenant, prefix + "-" + std::to_string(i), OrderBody(i, declined)});
  }
  return out;
}

// ship_order runs, in a cycle of four: completed, refused at shipping (country AQ: payment
// and inventory undone), declined at payment (inventory undone), completed.
std::vector<KeyRecord> MakeShipOrders(const std::string& prefix, int n) {
  std::vector<KeyRecord> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({"demo", prefix + "-" + std::to_string(i),
                   ShipOrderBody(i, i % 4 == 2, i % 4 == 1), chaos::kShipOrder});
  }
  return out;
}

// `a` and `b` alternated (then the rest of the longer one): both sagas run side by side.
std::vector<KeyRecord> Interleave(const std::vector<KeyRecord>& a,
                                  const std::vector<KeyRecord>& b) {
  std::vector<KeyRecord> out;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    if (i < a.size()) out.push_back(a[i]);
    if (i < b.size()) out.push_back(b[i]);
  }
  return out;
}

long long ShipOrders(const std::vector<KeyRecord>& records) {
  return std::count_if(records.begin(), records.end(),
                       [](const KeyRecord& r) { return r.saga == chaos::kShipOrder; });
}

// How far the clients of UnderLoad have got: chaos waits on this, not on the clock, so that
// a fault lands mid-load on a fast machine and on a sanitizer build alike.
class Load {
 public:
  explicit Load(size_t total) : total_(total) {}
  void Answered() { ++answered_; }
  // Waits until `n` attempts have returned (answered or not), or every order has.
  void WaitAnswered(size_t n) const {
    bool reached =
        test_support::WaitFor([&] { return answered_ >= std::min(n, total_); }, kStateTimeout);
    EXPECT_TRUE(reached) << answered_ << " of " << n << " attempts returned";
  }

 private:
  const size_t total_;
  std::atomic<size_t> answered_{0};
};

// Clients submit `records` (one attempt each, retrying only later in Settle) while
// `chaos(load)` runs on this thread.
template <typename Chaos>
void UnderLoad(Driver& driver, std::vector<KeyRecord>& records, int threads, Chaos chaos) {
  Load load(records.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (size_t i; (i = next++) < records.size();) {
        driver.Attempt(records[i], t);
        load.Answered();
        // Pacing, not a wait: spreads the submissions so that the chaos lands among them.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
  }
  chaos(load);
  for (auto& t : ts) t.join();
}

// A counter or gauge from a service's /metrics; 0 when it is missing or unreachable.
long long Metric(const std::string& url, const std::string& name) {
  httplib::Client c(url);
  c.set_connection_timeout(1);
  c.set_read_timeout(5);
  auto m = c.Get("/metrics");
  if (!m) return 0;
  auto pos = m->body.find("\n" + name + " ");
  return pos == std::string::npos ? 0 : std::stoll(m->body.substr(pos + name.size() + 2));
}

template <typename... Params>
long long Count(const std::string& database_url, const std::string& sql, const Params&... params) {
  pqxx::connection c(database_url);
  pqxx::nontransaction tx(c);
  return tx.exec_params(sql, params...)[0][0].template as<long long>();
}

// The status of the row one step key made ("" if none).
std::string StatusOf(const std::string& database_url, const std::string& sql,
                     const std::string& tenant, const std::string& step_key) {
  pqxx::connection c(database_url);
  pqxx::nontransaction tx(c);
  auto rows = tx.exec_params(sql, tenant, step_key);
  return rows.empty() ? "" : rows[0][0].as<std::string>();
}

void Expect(const chaos::Report& report, const std::string& line) {
  std::cout << line << std::endl;
  EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
}

constexpr const char* kReservations = "SELECT count(*) FROM reservations";
constexpr const char* kReservationStatus =
    "SELECT status FROM reservations WHERE tenant_id = $1 AND idempotency_key = $2";
constexpr const char* kChargeStatus =
    "SELECT status FROM charges WHERE tenant_id = $1 AND idempotency_key = $2";
// Shipments cancelled under keys that start with $1.
constexpr const char* kCancelledShipments =
    "SELECT count(*) FROM shipments "
    "WHERE status = 'cancelled' AND starts_with(idempotency_key, $1)";

// Every parent row's full state, by key: what a late write would change.
std::map<std::string, std::string> ParentRows(const Stack& stack) {
  pqxx::connection c(stack.DatabaseUrl("orchestrator"));
  pqxx::read_transaction tx(c);
  std::map<std::string, std::string> out;
  for (const auto& row : tx.exec("SELECT idempotency_key, k::text FROM idempotency_keys k")) {
    out[row[0].as<std::string>()] = row[1].as<std::string>();
  }
  return out;
}

class FaultSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { idemsaga::common::SetLogEnabled(false); }
};

TEST_F(FaultSuite, DuplicateStormMakesOneEffectPerKeyAndRefusesReuse) {
  Stack stack("storm");
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  Driver driver({stack.OrchestratorUrl(0)});
  constexpr int kKeys = 20, kDuplicates = 200;
  auto records = MakeOrders("storm", kKeys);
  std::map<int, int> statuses;
  long long differing_acks = 0;
  for (auto& r : records) {
    std::vector<KeyRecord> copies(kDuplicates, r);
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int d = 0; d < kDuplicates; ++d) {
      ts.emplace_back([&, d] {
        while (!go) std::this_thread::yield();
        driver.Attempt(copies[d], 0);
      });
    }
    go = true;
    for (auto& t : ts) t.join();
    std::set<std::string> bodies;
    for (const auto& c : copies) {
      for (auto [s, n] : c.statuses) statuses[s] += n;
      for (const auto& a : c.acks) bodies.insert(a);
      r.acks.insert(r.acks.end(), c.acks.begin(), c.acks.end());
    }
    differing_acks += bodies.size() > 1 ? 1 : 0;
  }
  Settle(driver, records);
  int reused = 0;
  for (int i = 0; i < 50; ++i) {
    KeyRecord other = records[i % kKeys];
    other.body = OrderBody(1000 + i, false);
    driver.Attempt(other, 0);
    reused += other.statuses[422];
  }
  auto report = chaos::CheckInvariants(stack, records);
  std::string extra =
      "requests=" + std::to_string(kKeys * kDuplicates) +
      " status_201=" + std::to_string(statuses[201]) +
      " status_402=" + std::to_string(statuses[402]) +
      " status_409=" + std::to_string(statuses[409]) + " other_status=" +
      std::to_string(kKeys * kDuplicates - statuses[201] - statuses[402] - statuses[409]) +
      " reuse_422=" + std::to_string(reused) + "/50";
  Expect(report, report.Line("duplicate_storm", extra));
  EXPECT_EQ(reused, 50);
  EXPECT_EQ(differing_acks, 0);
  EXPECT_EQ(statuses[201] + statuses[402] + statuses[409], kKeys * kDuplicates);
}

TEST_F(FaultSuite, KillNineAtEveryCrashPointLosesNothingAndDoublesNothing) {
  Stack stack("crash");
  stack.StartParticipants();
  Driver driver({stack.OrchestratorUrl(0)});
  const std::vector<std::string> points = {"after_claim",           "after_step_sent",
                                           "after_step_answer",     "after_compensating",
                                           "between_compensations", "after_finish"};
  // The same points in a round of ship_order runs sent one at a time (completed, refused at
  // shipping, declined, completed), at the hit that lands where no place_order goes when there
  // is a choice: the first run's shipping step, the second run's two compensations.
  const std::map<std::string, std::string> ship_points = {
      {"after_claim", "after_claim"},
      {"after_step_sent", "after_step_sent@3"},            // the shipment made, its answer unread
      {"after_step_answer", "after_step_answer@3"},        // shipped, not yet finished
      {"after_compensating", "after_compensating"},        // the refusal stored, nothing undone
      {"between_compensations", "between_compensations"},  // refunded, not yet released
      {"after_finish", "after_finish@2"}};                 // the refused run's failure stored
  std::vector<KeyRecord> all;
  int crashes = 0, ship_crashes = 0, refunded_not_released = 0;
  // Starts an orchestrator armed at `spec`, submits `records` from `threads` clients, and
  // returns once it has died there (or 10 s passed); then settles them on a fresh one.
  auto crash_round = [&](const std::string& spec, std::vector<KeyRecord>& records, int threads,
                         const std::function<void()>& at_crash) {
    stack.StartOrchestrator(0, spec);
    UnderLoad(driver, records, threads, [](Load&) {});
    bool crashed = stack.orchestrator(0).Exited(std::chrono::seconds(10));
    if (crashed && at_crash) at_crash();
    stack.KillOrchestrator(0);  // in case the point was not reached
    stack.StartOrchestrator(0);
    Settle(driver, records);
    stack.KillOrchestrator(0);
    all.insert(all.end(), records.begin(), records.end());
    return crashed ? 1 : 0;
  };
  for (const auto& point : points) {
    // Half declined, so that compensation runs and its crash points are reached.
    auto records = MakeOrders("crash-" + point, 4, 2);
    crashes += crash_round(point, records, 4, nullptr);
    // One client: the runs go in order, so the n-th time a point is reached is known.
    auto runs = MakeShipOrders("crash-ship-" + point, 4);
    std::function<void()> at_crash;
    if (point == "between_compensations") {
      const KeyRecord& refused = runs[1];
      at_crash = [&] {
        // Killed between its two compensations: the charge refunded, the stock still held.
        auto charge = StatusOf(stack.DatabaseUrl("payment"), kChargeStatus, refused.tenant,
                               refused.key + "-payment");
        auto reservation = StatusOf(stack.DatabaseUrl("inventory"), kReservationStatus,
                                    refused.tenant, refused.key + "-inventory");
        refunded_not_released += charge == "refunded" && reservation == "reserved" ? 1 : 0;
      };
    }
    ship_crashes += crash_round(ship_points.at(point), runs, 1, at_crash);
  }
  auto report = chaos::CheckInvariants(stack, all);
  Expect(report,
         report.Line("crash_points",
                     "ship_orders=" + std::to_string(ShipOrders(all)) + " points=" +
                         std::to_string(points.size()) + " crashes=" + std::to_string(crashes) +
                         " ship_order_crashes=" + std::to_string(ship_crashes) +
                         " refunded_not_released=" + std::to_string(refunded_not_released) + "/1"));
  // A declined place_order has one compensation: nothing lies between two, so that point is
  // reached only in the ship_order round.
  EXPECT_EQ(crashes, static_cast<int>(points.size()) - 1)
      << "every crash point but between_compensations must be reached in place_order runs";
  EXPECT_EQ(ship_crashes, static_cast<int>(points.size()))
      << "every crash point must be reached in a ship_order run";
  EXPECT_EQ(refunded_not_released, 1) << "between_compensations must fall between two";
}

TEST_F(FaultSuite, RandomKillsUnderLoadLoseNothingAndDoubleNothing) {
  Stack stack("random");
  stack.StartParticipants();
  Driver driver({stack.OrchestratorUrl(0)});
  std::mt19937 rng(42);
  std::vector<KeyRecord> all;
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    auto name = "random-" + std::to_string(round);
    auto records = Interleave(MakeOrders(name, 16), MakeShipOrders(name + "-ship", 8));
    stack.StartOrchestrator(0);
    UnderLoad(driver, records, 4, [&](Load& load) {
      // A random point in the load: after 1 to 12 of its 24 orders were answered.
      load.WaitAnswered(std::uniform_int_distribution<size_t>(1, 12)(rng));
      stack.KillOrchestrator(0);
    });
    all.insert(all.end(), records.begin(), records.end());
  }
  stack.StartOrchestrator(0);
  Settle(driver, all);
  auto report = chaos::CheckInvariants(stack, all);
  Expect(report, report.Line("random_kills", "ship_orders=" + std::to_string(ShipOrders(all)) +
                                                 " kills=" + std::to_string(kRounds)));
}

TEST_F(FaultSuite, ParticipantFaultsAndARestartedParticipantLoseNothingAndDoubleNothing) {
  Stack stack("participants", {.participant_timeout_ms = 800, .max_attempts = 8});
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  Driver driver({stack.OrchestratorUrl(0)});
  auto records = Interleave(MakeOrders("faults", 60), MakeShipOrders("faults-ship", 32));
  stack.SetFaults("payment", {{"error_rate", 0.25}, {"drop_after_commit_rate", 0.25}});
  stack.SetFaults("inventory", {{"drop_after_commit_rate", 0.2}});
  stack.SetFaults("shipping", {{"error_rate", 0.2}, {"drop_after_commit_rate", 0.25}});
  UnderLoad(driver, records, 4, [&](Load& load) {
    load.WaitAnswered(8);
    // Beyond the 800 ms read timeout: held until three reservations have committed under it,
    // each an answer its caller gave up on.
    auto reserved = [&] { return Count(stack.DatabaseUrl("inventory"), kReservations); };
    long long before = reserved();
    stack.SetFaults("inventory", {{"latency_ms", 1200}});
    EXPECT_TRUE(
        test_support::WaitFor([&] { return reserved() >= before + 3; }, kStateTimeout, kPoll));
    stack.SetFaults("inventory", {{"hang", true}});
    // A fault held for a time, not a wait for a state: a held request shows nowhere.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stack.SetFaults("inventory", {{"drop_after_commit_rate", 0.2}});
    stack.RestartParticipant("payment");  // kill -9 mid-load; faults reset with it
    stack.SetFaults("payment", {{"error_rate", 0.25}});
    load.WaitAnswered(records.size() / 2);
    stack.RestartParticipant("shipping");  // the last step's participant, as well
    stack.SetFaults("shipping", {{"drop_after_commit_rate", 0.25}});
  });
  for (const auto& which : chaos::kParticipants) stack.SetFaults(which, nlohmann::json::object());
  Settle(driver, records);
  // Shipments made but never answered, past every retry: the step stays in doubt, so the saga
  // cancels the shipment (the cancel's answer dropped too, until the fault stops) and fails.
  const std::string prefix = "in-doubt";
  std::vector<KeyRecord> in_doubt;
  for (int i = 0; i < 4; ++i) {
    in_doubt.push_back({"demo", prefix + "-" + std::to_string(i), ShipOrderBody(i, false, false),
                        chaos::kShipOrder});
  }
  stack.SetFaults("shipping", {{"drop_after_commit_rate", 1.0}});
  std::vector<std::thread> clients;
  for (auto& r : in_doubt) clients.emplace_back([&] { driver.Attempt(r, 0); });
  const auto n = static_cast<long long>(in_doubt.size());
  auto cancelled = [&] {
    return Count(stack.DatabaseUrl("shipping"), kCancelledShipments, prefix);
  };
  // Eight attempts, full-jitter backoff up to 5 s between them, then the cancel: up to about
  // 25 s of waiting by design, more on a loaded or sanitized build.
  EXPECT_TRUE(test_support::WaitFor([&] { return cancelled() >= n; }, 4 * kStateTimeout, kPoll));
  stack.SetFaults("shipping", nlohmann::json::object());
  for (auto& c : clients) c.join();
  Settle(driver, in_doubt);
  long long in_doubt_failed = 0;
  for (const auto& r : in_doubt) in_doubt_failed += r.final_status == 502 ? 1 : 0;
  records.insert(records.end(), in_doubt.begin(), in_doubt.end());
  auto report = chaos::CheckInvariants(stack, records);
  Expect(report, report.Line("participant_faults",
                             "ship_orders=" + std::to_string(ShipOrders(records)) +
                                 " restarted=payment,shipping shipping_in_doubt_cancelled=" +
                                 std::to_string(cancelled()) + "/" + std::to_string(n) +
                                 " failed_502=" + std::to_string(in_doubt_failed) + "/" +
                                 std::to_string(n)));
  EXPECT_EQ(cancelled(), n);
  EXPECT_EQ(in_doubt_failed, n);
}

TEST_F(FaultSuite, APostgresCrashMidLoadLosesNoAcknowledgedOrderAndHealsWithoutRestart) {
  Stack stack("pgcrash");
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  Driver driver({stack.OrchestratorUrl(0)});
  auto records = Interleave(MakeOrders("pg", 28), MakeShipOrders("pg-ship", 12));
  Clock::time_point restarted;
  UnderLoad(driver, records, 4, [&](Load& load) {
    load.WaitAnswered(6);
    Stack::Cluster().Crash();  // pg_ctl stop -m immediate
    // Down until the orchestrator has noticed: its readiness probe fails.
    httplib::Client probe(stack.OrchestratorUrl(0));
    probe.set_read_timeout(5);
    EXPECT_TRUE(test_support::WaitFor(
        [&] {
          auto r = probe.Get("/readyz");
          return r && r->status == 503;
        },
        kStateTimeout, kPoll));
    Stack::Cluster().Restart();
    restarted = Clock::now();
  });
  // Time to the first 2xx after PostgreSQL is back (no process was restarted).
  KeyRecord probe{"demo", "pg-probe", OrderBody(7, false)};
  Driver(std::vector<std::string>{stack.OrchestratorUrl(0)})
      .UntilFinal(probe, Clock::now() + kSettle);
  auto recovery_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - restarted).count();
  Settle(driver, records);
  records.push_back(probe);
  // 503 (nothing stored, retry) and 502 (a step's participant stayed down past its retries:
  // a stored, final answer) are what an outage may produce; any other 5xx would be a bug.
  int server_errors = 0;
  std::map<int, int> seen;
  for (const auto& r : records) {
    for (auto [s, n] : r.statuses) {
      server_errors += (s >= 500 && s != 503 && s != 502) ? n : 0;
      seen[s] += n;
    }
  }
  std::string histogram;
  for (auto [s, n] : seen)
    histogram += (histogram.empty() ? "" : ",") + std::to_string(s) + ":" + std::to_string(n);
  auto report = chaos::CheckInvariants(stack, records);
  Expect(report, report.Line("postgres_crash",
                             "ship_orders=" + std::to_string(ShipOrders(records)) + " statuses=" +
                                 histogram + " other_5xx=" + std::to_string(server_errors) +
                                 " first_2xx_after_restart_ms=" + std::to_string(recovery_ms)));
  EXPECT_EQ(server_errors, 0);
}

TEST_F(FaultSuite, TwoReplicasFinishTheSagasOfAThirdThatWasKilled) {
  Stack stack("replicas", {.replicas = 3});
  stack.StartParticipants();
  for (int i = 0; i < 3; ++i) stack.StartOrchestrator(i);
  Driver driver({stack.OrchestratorUrl(0), stack.OrchestratorUrl(1), stack.OrchestratorUrl(2)});
  auto records = Interleave(MakeOrders("replicas", 40), MakeShipOrders("replicas-ship", 20));
  stack.SetFaults("payment", {{"latency_ms", 150}});  // keep sagas in flight
  UnderLoad(driver, records, 6, [&](Load& load) {
    load.WaitAnswered(20);  // every replica now has sagas in flight
    stack.KillOrchestrator(0);
    driver.SetUrls({stack.OrchestratorUrl(1), stack.OrchestratorUrl(2)});
  });
  stack.SetFaults("payment", nlohmann::json::object());
  Settle(driver, records);
  long long resumed = 0;
  for (int i : {1, 2}) resumed += Metric(stack.OrchestratorUrl(i), "idemsaga_sagas_resumed_total");
  auto report = chaos::CheckInvariants(stack, records);
  Expect(report, report.Line("replicas", "ship_orders=" + std::to_string(ShipOrders(records)) +
                                             " replicas=3 killed=1 resumed_by_others=" +
                                             std::to_string(resumed)));
  // The real processes' /metrics after the storm: what promtool says of each page, and a
  // sample of the survivor's counters for the record.
  std::vector<std::string> urls = {stack.OrchestratorUrl(1)};
  for (const auto& p : chaos::kParticipants) urls.push_back(stack.ParticipantUrl(p));
  for (const auto& url : urls) {
    httplib::Client c(url);
    auto page = c.Get("/metrics");
    ASSERT_TRUE(page && page->status == 200) << url;
    EXPECT_EQ(test_support::PromtoolProblems(page->body), "") << url;
    if (url != urls.front()) continue;
    std::istringstream lines(page->body);
    for (std::string line; std::getline(lines, line);) {
      bool sample = line.rfind("idemsaga_", 0) == 0 && line.find("_bucket{") == std::string::npos;
      if (sample && line.substr(line.rfind(' ') + 1) != "0") std::cout << "  " << line << "\n";
    }
  }
}

// Orders paid by a card that needs 3-D Secure park, waiting for the card holder's answer,
// on the replica that took them; it is killed (kill -9) just after half of the answers reach
// it, some of those sagas mid-resume. The survivor finishes every one: captured once when
// confirmed, the authorisation voided and the stock released when refused or unanswered (the
// timeouts armed on the killed replica fire on the survivor).
TEST_F(FaultSuite, SagasWaitingForAnEventSurviveAKillNineAndFinishOnAnotherReplica) {
  constexpr int kOrders = 24;
  Stack stack("event_waits",
              {.replicas = 2, .orchestrator_args = {"--payment-confirmation-timeout-ms", "8000"}});
  stack.StartParticipants();
  for (int i = 0; i < 2; ++i) stack.StartOrchestrator(i);
  std::vector<KeyRecord> records;
  for (int i = 0; i < kOrders; ++i) {
    auto body = nlohmann::json::parse(OrderBody(i, false));
    body["payment_method"] = "pm_card_3ds";
    records.push_back({"demo", "event-waits-" + std::to_string(i), body.dump()});
  }
  Driver first({stack.OrchestratorUrl(0)});
  long long parked = 0;
  for (auto& r : records) {
    first.Attempt(r, 0);
    parked += r.statuses[202];
  }
  // A third confirm, a third refuse, a third never answer.
  std::map<int, int> answer_status;  // order -> the delivery's status
  auto answer = [&](int i, const std::string& url) {
    if (i % 3 == 2) return;
    httplib::Client c(url);
    c.set_connection_timeout(1);
    c.set_read_timeout(15);
    bool confirm = i % 3 == 0;
    auto res = c.Post(
        "/v1/runs/place_order/" + records[i].key + "/events/" +
            (confirm ? "payment_confirmed" : "payment_failed"),
        {{"Authorization", "Bearer dev-key-demo"}, {"Idempotency-Key", records[i].key + "-answer"}},
        confirm ? "{}" : R"({"reason":"declined by the issuer"})", "application/json");
    answer_status[i] = res ? res->status : 0;
  };
  for (int i = 0; i < kOrders / 2; ++i) answer(i, stack.OrchestratorUrl(0));
  stack.KillOrchestrator(0);
  for (int i = kOrders / 2; i < kOrders; ++i) answer(i, stack.OrchestratorUrl(1));
  Driver driver({stack.OrchestratorUrl(1)});
  Settle(driver, records);
  int answered = 0, confirmed_completed = 0, expected_confirmed = 0, unexpected = 0, timed_out = 0;
  for (int i = 0; i < kOrders; ++i) {
    if (answer_status[i] == 202) ++answered;
    // Never answered: the wait's durable timer, armed on the killed replica, fired on the
    // survivor.
    if (i % 3 == 2 &&
        records[i].final_body.find(R"("code":"payment_not_confirmed")") != std::string::npos) {
      ++timed_out;
    }
    bool confirmed = i % 3 == 0 && answer_status[i] == 202;
    expected_confirmed += confirmed ? 1 : 0;
    int want = confirmed ? 201 : 402;
    if (records[i].final_status == want) {
      confirmed_completed += confirmed ? 1 : 0;
    } else {
      ++unexpected;
      std::cout << "  " << records[i].key << " answered " << answer_status[i] << ", ended "
                << records[i].final_status << " " << records[i].final_body << "\n";
    }
  }
  auto report = chaos::CheckInvariants(stack, records);
  Expect(report, report.Line("event_waits",
                             "parked=" + std::to_string(parked) +
                                 " answers_delivered=" + std::to_string(answered) +
                                 " confirmed_completed=" + std::to_string(confirmed_completed) +
                                 " timers_fired=" + std::to_string(timed_out) + " killed=1"));
  EXPECT_EQ(parked, kOrders);
  EXPECT_EQ(answered, 2 * kOrders / 3);  // each delivery stored, none refused, none lost
  EXPECT_EQ(expected_confirmed, kOrders / 3);
  EXPECT_EQ(timed_out, kOrders / 3);
  EXPECT_EQ(unexpected, 0);
}

// place_order_parallel on a replica armed to die (kill -9) the first time one branch of the
// group has ended while its sibling is still out: the stock reserved and the charge in flight,
// or the other way round. The other replica takes the saga over and ends it (the branch that
// had ended is replayed by its participant and not applied again; the other is sent again, or
// undone if its sibling was refused). Four rounds, each with a fresh armed replica.
TEST_F(FaultSuite, AKillNineBetweenTwoParallelBranchesIsFinishedByAnotherReplica) {
  constexpr int kRounds = 4;
  Stack stack("parallel", {.replicas = 2});
  stack.StartParticipants();
  stack.StartOrchestrator(1);
  stack.SetFaults("payment", {{"latency_ms", 30}});  // the charge ends after the reservation
  std::vector<KeyRecord> all;
  int crashes = 0;
  for (int round = 0; round < kRounds; ++round) {
    stack.StartOrchestrator(0, "between_parallel_branches");
    std::vector<KeyRecord> records;
    for (int i = 0; i < 4; ++i) {
      records.push_back({"demo", "parallel-" + std::to_string(round) + "-" + std::to_string(i),
                         OrderBody(i, i % 2 == 1), chaos::kPlaceOrderParallel});
    }
    Driver first({stack.OrchestratorUrl(0)});
    UnderLoad(first, records, 4, [](Load&) {});
    crashes += stack.orchestrator(0).Exited(std::chrono::seconds(10)) ? 1 : 0;
    stack.KillOrchestrator(0);  // in case the point was not reached
    Driver survivor({stack.OrchestratorUrl(1)});
    Settle(survivor, records);
    all.insert(all.end(), records.begin(), records.end());
  }
  stack.SetFaults("payment", nlohmann::json::object());
  // Taken over by the survivor's recovery, or by a client's retry that found the lease run out.
  long long resumed = Metric(stack.OrchestratorUrl(1), "idemsaga_sagas_resumed_total") +
                      Metric(stack.OrchestratorUrl(1),
                             R"(idemsaga_idempotency_requests_total{outcome="taken_over"})");
  auto report = chaos::CheckInvariants(stack, all);
  Expect(report,
         report.Line("parallel_branches", "runs=" + std::to_string(all.size()) +
                                              " crashes=" + std::to_string(crashes) +
                                              " resumed_by_other=" + std::to_string(resumed)));
  EXPECT_EQ(crashes, kRounds) << "every round must die between two branches";
  EXPECT_GE(resumed, kRounds) << "each round's killed saga is finished by the other replica";
}

// deliver_order (place_order as a child saga under "<key>-order", then shipping) on a replica
// armed to die (kill -9) inside the child, one run per round: the child's stock reserved and
// its charge not yet sent; its charge sent and the answer unread; a declined child's decision
// to undo itself committed and nothing undone; a refused shipment's compensation of the
// completed child between its refund and its release. The other replica takes each over and
// ends it: a child's call already made is replayed by its participant, never applied twice.
TEST_F(FaultSuite, AKillNineInsideAChildSagaIsFinishedByAnotherReplica) {
  struct Round {
    const char* point;
    bool declined, unserviceable;
  };
  const std::vector<Round> rounds = {{"after_step_answer@1", false, false},
                                     {"after_step_sent@2", false, false},
                                     {"after_compensating@1", true, false},
                                     {"between_compensations@1", false, true}};
  Stack stack("child", {.replicas = 2});
  stack.StartParticipants();
  stack.StartOrchestrator(1);
  std::vector<KeyRecord> all;
  int crashes = 0, inside = 0;
  for (size_t r = 0; r < rounds.size(); ++r) {
    stack.StartOrchestrator(0, rounds[r].point);
    std::vector<KeyRecord> records = {
        {"demo", "child-" + std::to_string(r),
         chaos::DeliverOrderBody(static_cast<int>(r), rounds[r].declined, rounds[r].unserviceable),
         chaos::kDeliverOrder}};
    Driver first({stack.OrchestratorUrl(0)});
    first.Attempt(records[0], 0);
    bool crashed = stack.orchestrator(0).Exited(std::chrono::seconds(10));
    crashes += crashed ? 1 : 0;
    if (crashed) {
      // Where the child stood when the replica died, in the participants' own tables.
      const std::string child = records[0].key + "-order";
      auto reservation = StatusOf(stack.DatabaseUrl("inventory"), kReservationStatus, "demo",
                                  child + "-inventory");
      auto charge =
          StatusOf(stack.DatabaseUrl("payment"), kChargeStatus, "demo", child + "-payment");
      bool where = r == 0   ? reservation == "reserved" && charge.empty()
                   : r == 3 ? reservation == "reserved" && charge == "refunded"
                            : reservation == "reserved";
      inside += where ? 1 : 0;
      if (!where) std::cout << "  round " << r << ": " << reservation << " / " << charge << "\n";
    }
    stack.KillOrchestrator(0);  // in case the point was not reached
    Driver survivor({stack.OrchestratorUrl(1)});
    Settle(survivor, records);
    all.insert(all.end(), records.begin(), records.end());
  }
  long long resumed = Metric(stack.OrchestratorUrl(1), "idemsaga_sagas_resumed_total") +
                      Metric(stack.OrchestratorUrl(1),
                             R"(idemsaga_idempotency_requests_total{outcome="taken_over"})");
  auto report = chaos::CheckInvariants(stack, all);
  Expect(report, report.Line("child_sagas", "runs=" + std::to_string(all.size()) +
                                                " crashes=" + std::to_string(crashes) +
                                                " inside_child=" + std::to_string(inside) +
                                                " resumed_by_other=" + std::to_string(resumed)));
  EXPECT_EQ(crashes, static_cast<int>(rounds.size())) << "every round must die inside the child";
  EXPECT_EQ(inside, static_cast<int>(rounds.size()));
  EXPECT_GE(resumed, static_cast<long long>(rounds.size()));
  // Completed, completed, declined (402), refused at shipping (422): each as it would have
  // ended without the crash.
  std::vector<int> want = {201, 201, 402, 422}, got;
  for (const auto& rec : all) got.push_back(rec.final_status);
  EXPECT_EQ(got, want);
}

TEST_F(FaultSuite, AZombieOwnersLateWritesAreFencedAfterATakeover) {
  Stack stack("zombie", {.replicas = 2});
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  stack.StartOrchestrator(1);
  Driver to_zombie({stack.OrchestratorUrl(0)});
  auto records = MakeOrders("zombie", 6);
  stack.SetFaults("payment", {{"latency_ms", 1000}});  // every saga is mid-payment
  std::vector<std::thread> clients;
  for (auto& r : records) clients.emplace_back([&] { to_zombie.Attempt(r, 0); });
  // Every saga has its reservation, so each is in its payment call.
  const auto n = static_cast<long long>(records.size());
  EXPECT_TRUE(test_support::WaitFor(
      [&] { return Count(stack.DatabaseUrl("inventory"), kReservations) >= n; }, kStateTimeout,
      kPoll));
  stack.orchestrator(0).Signal(SIGSTOP);
  // Past the 2 s lease, replica 1's sweeper takes every saga over.
  Driver survivor({stack.OrchestratorUrl(1)});
  EXPECT_TRUE(test_support::WaitFor(
      [&] { return Metric(stack.OrchestratorUrl(1), "idemsaga_sagas_resumed_total") >= n; },
      kStateTimeout, kPoll));
  stack.SetFaults("payment", nlohmann::json::object());
  for (auto& r : records) {
    KeyRecord probe = r;
    survivor.UntilFinal(probe, Clock::now() + kSettle);
  }
  auto before = ParentRows(stack);  // as the survivor left them
  stack.orchestrator(0).Signal(SIGCONT);
  for (auto& c : clients) c.join();
  // The zombie wakes up in the middle of every saga and tries a late write for each; wait
  // until all were refused (if one got through instead, the wait times out and `applied`
  // below says so).
  long long fenced = 0;
  test_support::WaitFor(
      [&] {
        fenced = Metric(stack.OrchestratorUrl(0), "idemsaga_fenced_writes_total");
        return fenced >= n;
      },
      kStateTimeout, kPoll);
  auto after = ParentRows(stack);
  int applied = 0;  // rows the zombie changed after the takeover
  for (const auto& [key, row] : before) applied += after[key] != row ? 1 : 0;
  Settle(survivor, records);
  auto report = chaos::CheckInvariants(stack, records);
  Expect(report, report.Line("zombie", "fenced_writes=" + std::to_string(fenced) +
                                           " applied_late_writes=" + std::to_string(applied)));
  EXPECT_GT(fenced, 0);
  EXPECT_EQ(applied, 0);
  EXPECT_EQ(before.size(), records.size());
}

TEST_F(FaultSuite, TenantsCannotReadOrCollideWithEachOthersKeys) {
  Stack stack("tenants");
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  Driver driver({stack.OrchestratorUrl(0)});
  auto demo = MakeOrders("shared", 10, 0, "demo");
  auto acme = MakeOrders("shared", 10, 0, "acme");  // the same keys and bodies
  Settle(driver, demo);
  Settle(driver, acme);
  httplib::Client c(stack.OrchestratorUrl(0));
  int probes = 0, leaks = 0;
  auto only_demo = MakeOrders("demo-only", 5, 0, "demo");
  Settle(driver, only_demo);
  for (const auto& r : only_demo) {
    ++probes;
    auto get = c.Get(("/v1/orders/" + r.key).c_str(), {{"Authorization", "Bearer dev-key-acme"}});
    leaks += (get && get->status != 404) ? 1 : 0;
    ++probes;
    auto retry = c.Post(("/v1/sagas/" + r.key + "/retry").c_str(),
                        {{"Authorization", "Bearer dev-key-acme"}}, "", "application/json");
    leaks += (retry && retry->status != 404) ? 1 : 0;
  }
  ++probes;
  auto list = c.Get("/v1/sagas?limit=500", {{"Authorization", "Bearer dev-key-acme"}});
  ASSERT_TRUE(list);
  // Named: a range-for over a member of a temporary would iterate freed memory.
  const auto listed = nlohmann::json::parse(list->body);
  for (const auto& s : listed["sagas"]) {
    leaks += s["idempotency_key"].get<std::string>().rfind("demo-only", 0) == 0 ? 1 : 0;
  }
  int shared_distinct = 0;
  for (size_t i = 0; i < demo.size(); ++i) {
    auto a = nlohmann::json::parse(demo[i].final_body)["order_id"];
    auto b = nlohmann::json::parse(acme[i].final_body)["order_id"];
    shared_distinct += a != b ? 1 : 0;
  }
  std::vector<KeyRecord> all = demo;
  all.insert(all.end(), acme.begin(), acme.end());
  all.insert(all.end(), only_demo.begin(), only_demo.end());
  auto report = chaos::CheckInvariants(stack, all);
  Expect(report, report.Line("tenants", "probes=" + std::to_string(probes) +
                                            " leaks=" + std::to_string(leaks) +
                                            " shared_keys_distinct_orders=" +
                                            std::to_string(shared_distinct) + "/10"));
  EXPECT_EQ(leaks, 0);
  EXPECT_EQ(shared_distinct, 10);
}

}  // namespace
