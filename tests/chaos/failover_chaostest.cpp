// Failover chaos: the fault suite's invariants (chaos_harness.hpp) with every database on
// PostgreSQL under Patroni (ha_cluster.hpp: three etcd members, a primary and two replicas
// with synchronous replication, HAProxy in front), the services reaching it through HAProxy.
// One cluster and one stack serve four scenarios, each under order load and each followed by
// settling every order, the invariants over every order so far and `idemsaga reconcile`: no
// acknowledged order lost, no double or orphan effect, every saga ended, and no order failed
// (a failover delays an order, it never refuses one). The faults: kill -9 of the primary's
// postmaster three times in a row; a planned switchover; SIGSTOP of the primary's postgres
// processes for 20 s (the old primary must acknowledge no write once it wakes); the loss of
// etcd's quorum for 15 s. After a kill Patroni may restart the primary in place instead of
// failing over (see the scenario). Each prints the orders that failed or were delayed, and the
// seconds from the fault to the first 201 of an order sent after it (docs/testing.md keeps them).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <iostream>
#include <mutex>
#include <pqxx/pqxx>
#include <set>
#include <thread>

#include "common/log.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/ha_cluster.hpp"
#include "tests/support/wait.hpp"

namespace {

using chaos::Driver;
using chaos::HaCluster;
using chaos::KeyRecord;
using chaos::Stack;
using Clock = std::chrono::steady_clock;

// A promotion after a crash takes a few seconds (primary_start_timeout 0, loop_wait 1), as
// does a restart in place (crash recovery); after a pause up to the leader key's ttl (10 s);
// the old primary's return as a standby (pg_rewind, recovery) some more.
constexpr auto kPromoted = std::chrono::seconds(60);
constexpr auto kHealthy = std::chrono::seconds(90);
constexpr auto kSettle = std::chrono::seconds(120);
// Orders in flight when a fault lands.
constexpr auto kLoadBeforeFault = std::chrono::seconds(3);
constexpr auto kPause = std::chrono::seconds(20);
constexpr auto kQuorumLoss = std::chrono::seconds(15);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Figure(const std::string& name, double value) {
  char out[96];
  std::snprintf(out, sizeof out, " %s=%.1f", name.c_str(), value);
  return out;
}

// Clients that send new orders (one attempt each; the scenario's end settles the rest) until
// stopped, noting when each 201 was asked for and answered.
class OrderLoad {
 public:
  OrderLoad(Driver& driver, const std::string& prefix) {
    for (int t = 0; t < 4; ++t) {
      clients_.emplace_back([this, &driver, prefix, t] {
        while (!stop_) {
          int i = next_++;
          KeyRecord r{"demo", prefix + std::to_string(i), chaos::OrderBody(i, i % 5 == 4)};
          auto sent = Clock::now();
          driver.Attempt(r, t);
          auto answered = Clock::now();
          std::lock_guard lock(mutex_);
          if (r.statuses.count(201) != 0) created_.emplace_back(sent, answered);
          if (i % 5 == 4) declined_.insert(r.key);
          records_.push_back(std::move(r));
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
  }
  ~OrderLoad() { Stop(); }

  void Stop() {
    stop_ = true;
    for (auto& c : clients_) {
      if (c.joinable()) c.join();
    }
  }

  // Seconds from `from` to the first 201 answered to an order sent at or after it, waiting up
  // to kPromoted; -1 if none came.
  double FirstCreatedAfter(Clock::time_point from) {
    double first = -1;
    test_support::WaitFor(
        [&] {
          std::lock_guard lock(mutex_);
          for (const auto& [sent, answered] : created_) {
            double s = Seconds(answered - from);
            if (sent >= from && (first < 0 || s < first)) first = s;
          }
          return first >= 0;
        },
        kPromoted, std::chrono::milliseconds(50));
    return first;
  }

  // 201s to orders sent at or after `from` and answered before `to`.
  int CreatedBetween(Clock::time_point from, Clock::time_point to) {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& [sent, answered] : created_) n += sent >= from && answered < to ? 1 : 0;
    return n;
  }

  // The longest time between two 201s (answered), over the whole load: how long the orders
  // could not complete.
  double LongestGapWithout201() {
    std::lock_guard lock(mutex_);
    std::vector<Clock::time_point> answered;
    for (const auto& c : created_) answered.push_back(c.second);
    std::sort(answered.begin(), answered.end());
    double gap = 0;
    for (size_t i = 1; i < answered.size(); ++i) {
      gap = std::max(gap, Seconds(answered[i] - answered[i - 1]));
    }
    return gap;
  }

  // Once stopped.
  std::vector<KeyRecord>& records() { return records_; }
  bool Declined(const std::string& key) const { return declined_.count(key) != 0; }

 private:
  std::mutex mutex_;
  std::vector<KeyRecord> records_;
  std::set<std::string> declined_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> created_;  // sent, answered
  std::atomic<bool> stop_{false};
  std::atomic<int> next_{0};
  std::vector<std::thread> clients_;
};

// Processes stopped with SIGSTOP until Resume() or the end of the scope, so that a failed
// assertion leaves nothing frozen.
class Stopped {
 public:
  explicit Stopped(std::vector<pid_t> pids) {
    for (pid_t pid : pids) {
      // A backend may have ended meanwhile; the rest must stop.
      if (kill(pid, SIGSTOP) == 0) pids_.push_back(pid);
    }
  }
  ~Stopped() { Resume(); }
  size_t count() const { return pids_.size(); }
  void Resume() {
    for (pid_t pid : pids_) kill(pid, SIGCONT);
    pids_.clear();
  }

 private:
  std::vector<pid_t> pids_;
};

// Ports for one run: 31 from a base picked by this process (another run may hold others).
int BasePort() { return 20000 + static_cast<int>(getpid() % 200) * 40; }

class Failover : public ::testing::Test {
 protected:
  // One cluster for every scenario: its bootstrap is the slowest part of the file.
  static void SetUpTestSuite() {
    idemsaga::common::SetLogEnabled(false);
    try {
      ha_ = std::make_unique<HaCluster>(BasePort());
      stack_ = std::make_unique<Stack>("failover", chaos::StackOptions{.server_url = ha_->Url()});
      stack_->StartParticipants();
      stack_->StartOrchestrator(0);
      driver_ = std::make_unique<Driver>(std::vector<std::string>{stack_->OrchestratorUrl(0)});
    } catch (const std::exception& e) {
      setup_error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    driver_.reset();
    stack_.reset();
    ha_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(driver_) << setup_error_;
    // Each fault only once a synchronous standby holds every commit again.
    ASSERT_TRUE(test_support::WaitFor([] { return ha_->Healthy(); }, kHealthy))
        << "the cluster is not healthy before the scenario";
  }
  void TearDown() override {
    if (HasFailure() && ha_) ha_->KeepLogs();
  }

  struct Recovery {
    double seconds = -1;    // from the fault to a primary seen through HAProxy; -1 if none
    bool in_place = false;  // the victim itself, back after crash recovery
  };
  // Waits for a primary through HAProxy until `deadline`: a member other than `victim`
  // promoted, or with `killed` (the victim's crashed postmaster) also the victim restarted as
  // primary by its Patroni under another postmaster.
  static Recovery Recovered(const std::string& victim, pid_t killed, Clock::time_point fault_at,
                            Clock::time_point deadline) {
    Recovery r;
    bool back = test_support::WaitFor(
        [&] {
          auto now = ha_->CurrentPrimary().data_dir;
          r.in_place = now == victim;
          return !now.empty() &&
                 (!r.in_place || (killed > 0 && HaCluster::PostmasterOf(victim) != killed));
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
        std::chrono::milliseconds(100));
    if (back) r.seconds = Seconds(Clock::now() - fault_at);
    return r;
  }

  // The seconds from `fault_at` until Patroni promoted a member other than `victim`, -1 if
  // none did by `deadline`.
  static double Promoted(const std::string& victim, Clock::time_point fault_at,
                         Clock::time_point deadline) {
    return Recovered(victim, 0, fault_at, deadline).seconds;
  }

  // Pauses the primary's PostgreSQL (its postmaster and every process it forked) for kPause
  // and with `patroni` its Patroni too (a frozen machine).
  static void PauseThePrimary(const std::string& scenario, bool patroni) {
    {
      pqxx::connection c(ha_->Url());
      pqxx::nontransaction tx(c);
      tx.exec0("CREATE TABLE IF NOT EXISTS failover_probe (tag text PRIMARY KEY)");
    }
    OrderLoad load(*driver_, scenario + "-");
    std::this_thread::sleep_for(kLoadBeforeFault);
    auto victim = ha_->CurrentPrimary();
    ASSERT_FALSE(victim.data_dir.empty());
    long timeline_before = ha_->Timelines()[victim.name];
    pid_t postmaster = HaCluster::PostmasterOf(victim.data_dir);
    ASSERT_GT(postmaster, 0);
    pid_t its_patroni = patroni ? HaCluster::PatroniOf(victim.data_dir) : 0;
    ASSERT_GE(its_patroni, 0) << "no Patroni runs " << victim.data_dir;
    auto fault_at = Clock::now();
    Stopped frozen_patroni(patroni ? std::vector<pid_t>{its_patroni} : std::vector<pid_t>{});
    // The postmaster first, so that it forks no backend after the children are listed (each
    // child sits in a process group of its own: the postmaster's group is not enough).
    Stopped frozen_postmaster({postmaster});
    Stopped frozen_children(HaCluster::ChildrenOf(postmaster));
    ASSERT_EQ(frozen_postmaster.count(), 1U);
    ASSERT_GT(frozen_children.count(), 3U) << "no backends stopped";
    double promoted = Promoted(victim.data_dir, fault_at, fault_at + kPause);
    std::this_thread::sleep_until(fault_at + kPause);
    frozen_postmaster.Resume();
    frozen_children.Resume();
    // Until its Patroni wakes, the old primary is a primary on its own: write to it directly.
    std::future<std::string> probe;
    if (promoted >= 0) {
      probe = std::async(std::launch::async, [port = victim.port, scenario] {
        try {
          pqxx::connection c(ha_->MemberUrl(port) + "?connect_timeout=2");
          pqxx::nontransaction tx(c);
          tx.exec_params0("INSERT INTO failover_probe VALUES ($1)", scenario);
          return std::string("acknowledged");
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      });
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    frozen_patroni.Resume();
    if (patroni) {
      ASSERT_GE(promoted, 0) << "Patroni promoted no standby while the primary was frozen";
    }
    double first = load.FirstCreatedAfter(fault_at);
    ASSERT_GE(first, 0) << "no order was created after the pause";
    ASSERT_TRUE(test_support::WaitFor([] { return ha_->Healthy(); }, kHealthy))
        << "the cluster did not heal after the pause";
    std::string figures = Figure("promoted_s", promoted) + Figure("first_201_s", first);
    if (promoted >= 0) {
      ASSERT_EQ(probe.wait_for(kPromoted), std::future_status::ready)
          << "a write to the woken primary neither committed nor failed";
      std::string answer = probe.get();
      EXPECT_NE(answer, "acknowledged") << "the demoted primary acknowledged a write";
      auto count_probe = [&](const std::string& url) {
        pqxx::connection c(url);
        pqxx::nontransaction tx(c);
        return tx.exec_params1("SELECT count(*) FROM failover_probe WHERE tag = $1", scenario)[0]
            .as<int>();
      };
      EXPECT_EQ(count_probe(ha_->Url()), 0) << "a write of the old timeline reached the new one";
      // Healthy() may see the woken member's stale "running" before its demotion: wait for it
      // to report the new primary's timeline, then read the probe table on it.
      auto now = ha_->CurrentPrimary();
      int on_old = -1;
      EXPECT_TRUE(test_support::WaitFor(
          [&] {
            auto timelines = ha_->Timelines();
            if (timelines[victim.name] <= timeline_before ||
                timelines[victim.name] != timelines[now.name]) {
              return false;
            }
            try {
              on_old = count_probe(ha_->MemberUrl(victim.port) + "?connect_timeout=1");
              return true;
            } catch (const std::exception&) {
              return false;
            }
          },
          kHealthy))
          << "the old primary did not follow the new timeline";
      EXPECT_EQ(on_old, 0) << "the old primary kept a write of its old timeline";
      figures +=
          " woken_primary_write=" + std::string(answer == "acknowledged" ? "acked" : "refused");
    }
    Finish(scenario, load, figures);
  }

  // Settles the scenario's orders, checks the invariants over every order so far, prints the
  // figures and expects every invariant at 0 and no order failed.
  static void Finish(const std::string& scenario, OrderLoad& load, const std::string& figures) {
    load.Stop();
    auto& records = load.records();
    long long delayed = 0, failed = 0;
    for (const auto& r : records) delayed += r.final ? 0 : 1;
    chaos::Settle(*driver_, records, kSettle);
    for (const auto& r : records) failed += !load.Declined(r.key) && r.final_status != 201;
    all_.insert(all_.end(), records.begin(), records.end());
    auto report = chaos::CheckInvariants(*stack_, all_);
    std::string line = report.Line(
        scenario, "failed=" + std::to_string(failed) + " delayed=" + std::to_string(delayed) +
                      Figure("longest_without_201_s", load.LongestGapWithout201()) + figures);
    std::cout << line << std::endl;
    EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
    // A failover is an outage of seconds, not a refusal: an order is delayed, never failed.
    EXPECT_EQ(failed, 0) << line;
  }

  static inline std::unique_ptr<HaCluster> ha_;
  static inline std::unique_ptr<Stack> stack_;
  static inline std::unique_ptr<Driver> driver_;
  static inline std::vector<KeyRecord> all_;  // every scenario's orders, settled
  static inline std::string setup_error_;
};

TEST_F(Failover, KillingThePrimaryThreeTimesUnderLoadLosesNoOrderAndDoublesNoEffect) {
  OrderLoad load(*driver_, "kill-");
  std::string figures;
  for (int fault = 1; fault <= 3; ++fault) {
    std::this_thread::sleep_for(kLoadBeforeFault);
    auto victim = ha_->CurrentPrimary();
    ASSERT_FALSE(victim.data_dir.empty()) << "no primary before fault " << fault;
    pid_t postmaster = HaCluster::PostmasterOf(victim.data_dir);
    ASSERT_GT(postmaster, 0);
    const size_t logged = ha_->MemberLog(victim.name).size();
    auto fault_at = Clock::now();
    ASSERT_EQ(kill(postmaster, SIGKILL), 0);
    // Patroni fails over only to the standby its /sync key names. Its loop may read
    // pg_stat_replication on its own backend, still alive, after the dying postmaster's WAL
    // senders have gone, and drop that privilege ("Updating synchronous privilege temporarily
    // from ['pg1'] to []"); it then finds no standby it may promote and restarts the crashed
    // primary in place, as primary_start_timeout 0 allows ("if possible"). Both are recoveries
    // the services must ride out: the line says which one came.
    auto recovery = Recovered(victim.data_dir, postmaster, fault_at, fault_at + kPromoted);
    ASSERT_GE(recovery.seconds, 0) << "no primary came back after fault " << fault;
    if (recovery.in_place) {
      // Only where Patroni's check for a standby to fail over to ran and found none (the
      // reasons it logs, ha.py's is_failover_possible), not a restart that never looked.
      std::string since = ha_->MemberLog(victim.name).substr(logged);
      bool explained = false;
      for (const char* reason :
           {"members list is empty", "INFO: Member pg", "is behind the cluster timeline"}) {
        explained = explained || since.find(reason) != std::string::npos;
      }
      EXPECT_TRUE(explained) << "fault " << fault << ": Patroni restarted " << victim.name
                             << " in place without looking for a standby to fail over to";
    }
    double first = load.FirstCreatedAfter(fault_at);
    ASSERT_GE(first, 0) << "no order was created after fault " << fault;
    std::string tag = "fault" + std::to_string(fault);
    figures += Figure(tag + (recovery.in_place ? "_restarted_in_place_s" : "_promoted_s"),
                      recovery.seconds) +
               Figure(tag + "_first_201_s", first);
    ASSERT_TRUE(test_support::WaitFor([] { return ha_->Healthy(); }, kHealthy))
        << "the cluster did not heal after fault " << fault;
  }
  Finish("failover_kill_primary_x3", load, figures);
}

TEST_F(Failover, APlannedSwitchoverUnderLoadLosesNoOrderAndDoublesNoEffect) {
  OrderLoad load(*driver_, "switchover-");
  std::this_thread::sleep_for(kLoadBeforeFault);
  auto before = ha_->CurrentPrimary();
  ASSERT_FALSE(before.data_dir.empty());
  auto fault_at = Clock::now();
  std::string answer = ha_->Switchover(before.name);
  EXPECT_EQ(answer.rfind("200 ", 0), 0U) << answer;
  double promoted = Promoted(before.data_dir, fault_at, fault_at + kPromoted);
  ASSERT_GE(promoted, 0) << "no other primary after the switchover: " << answer;
  double first = load.FirstCreatedAfter(fault_at);
  ASSERT_GE(first, 0) << "no order was created after the switchover";
  ASSERT_TRUE(test_support::WaitFor([] { return ha_->Healthy(); }, kHealthy));
  Finish("failover_switchover", load,
         Figure("promoted_s", promoted) + Figure("first_201_s", first));
}

// A primary whose PostgreSQL stops answering while its Patroni runs on (a hung disk): Patroni
// 3.0 keeps renewing the leader key, so no failover comes; writes wait for the pause and
// resume on the same primary, and nothing is lost or doubled.
TEST_F(Failover, APausedPrimaryPostgresDelaysOrdersAndLosesNone) {
  PauseThePrimary("failover_pause_postgres_20s", false);
}

// A frozen primary machine (its PostgreSQL and its Patroni) is failed over once its leader
// key expires; when it wakes, its PostgreSQL still believes it is the primary until its
// Patroni sees the key gone and demotes it. A write sent to it in that window must not be
// acknowledged (its synchronous standby is now the primary and confirms nothing), and nothing
// it wrote may survive its return as a standby of the new timeline (pg_rewind).
TEST_F(Failover, AFrozenPrimaryAcknowledgesNoWriteAfterItsDemotionAndLosesNoOrder) {
  PauseThePrimary("failover_pause_member_20s", true);
}

// Without a majority of etcd Patroni cannot renew the leader key; with failsafe_mode off (the
// default, and the script's) the primary demotes itself: writes stop rather than risk two
// primaries. Nothing acknowledged is lost, and writes resume once the quorum is back.
TEST_F(Failover, LosingEtcdsQuorumStopsWritesLosesNothingAndWritesResume) {
  OrderLoad load(*driver_, "quorum-");
  std::this_thread::sleep_for(kLoadBeforeFault);
  pid_t etcd2 = ha_->EtcdPid(2), etcd3 = ha_->EtcdPid(3);
  ASSERT_GT(etcd2, 0);
  ASSERT_GT(etcd3, 0);
  auto fault_at = Clock::now();
  // Stopped, not killed: the script ends the whole cluster when one of its processes exits,
  // and to the surviving member a frozen peer and a dead one are the same.
  Stopped stopped({etcd2, etcd3});
  bool demoted = test_support::WaitFor([] { return ha_->CurrentPrimary().data_dir.empty(); },
                                       kQuorumLoss, std::chrono::milliseconds(100));
  auto demoted_at = Clock::now();
  std::this_thread::sleep_until(fault_at + kQuorumLoss);
  auto restored_at = Clock::now();
  stopped.Resume();
  EXPECT_TRUE(demoted) << "the primary kept accepting writes without etcd's quorum";
  double back = Promoted("", restored_at, restored_at + kPromoted);
  ASSERT_GE(back, 0) << "no primary after the quorum came back";
  double first = load.FirstCreatedAfter(restored_at);
  ASSERT_GE(first, 0) << "no order was created after the quorum came back";
  // An order sent while there was no primary cannot even claim its key: none is created
  // before the quorum is back.
  int created_without_primary = load.CreatedBetween(demoted_at, restored_at);
  if (demoted) {
    EXPECT_EQ(created_without_primary, 0);
  }
  ASSERT_TRUE(test_support::WaitFor([] { return ha_->Healthy(); }, kHealthy));
  Finish("failover_etcd_quorum_lost_15s", load,
         Figure("writes_stopped_after_s", demoted ? Seconds(demoted_at - fault_at) : -1) +
             Figure("primary_back_after_quorum_s", back) +
             Figure("first_201_after_quorum_s", first) +
             " created_without_primary=" + std::to_string(created_without_primary));
}

}  // namespace
