// Failover chaos: the fault suite's invariants (chaos_harness.hpp) with every database on
// PostgreSQL under Patroni (`scripts/ha --db-only`: three etcd members, a primary and two
// replicas with synchronous replication, HAProxy in front), the services reaching it through
// HAProxy. Under order load the primary's postmaster is killed with SIGKILL three times in a
// row, each time once Patroni has promoted a standby and a synchronous standby is back; then
// every order is settled and the invariants and `idemsaga reconcile` must find nothing: no
// acknowledged order lost, no double or orphan effect, every saga ended. Prints the orders
// that failed or were delayed, and the time from each fault to the first 201 of an order sent
// after it. Everything it starts is the script's, stopped by the script (SIGTERM), or by the
// parent-death signals the script gives its children should this process die first.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.hpp"
#include "common/pg/cluster.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/wait.hpp"

namespace {

namespace fs = std::filesystem;
using chaos::Driver;
using chaos::KeyRecord;
using chaos::Stack;
using Clock = std::chrono::steady_clock;

// Bootstrap of three members (initdb, two base backups) on a busy 2-core machine.
constexpr auto kClusterReady = std::chrono::minutes(4);
// A promotion after a crash takes a few seconds (primary_start_timeout 0, loop_wait 1); the
// old primary's return as a standby (pg_rewind, recovery) some more.
constexpr auto kPromoted = std::chrono::seconds(60);
constexpr auto kHealthy = std::chrono::seconds(90);
constexpr auto kSettle = std::chrono::seconds(120);
constexpr int kFaults = 3;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The script's cluster on ports from `base` (see scripts/ha), in a folder of its own.
class HaCluster {
 public:
  explicit HaCluster(int base) : base_(base) {
    dir_ = idemsaga::common::pg::PrivateCluster::MakeTempDir();
    // As root Patroni runs as `postgres`, which must enter the folder (else the script puts
    // the members under /var/lib/idemsaga, which this test would leave behind).
    chmod(dir_.c_str(), 0755);
    script_ = std::make_unique<chaos::Process>(
        std::vector<std::string>{"/bin/bash", std::string(IDEMSAGA_SOURCE_DIR) + "/scripts/ha",
                                 "--db-only", "--dir", dir_.string(), "--base-port",
                                 std::to_string(base_)},
        std::map<std::string, std::string>{}, (dir_ / "ha.out").string());
    bool ready = test_support::WaitFor(
        [&] {
          return Slurp(dir_ / "ha.out").find("ha ready") != std::string::npos ||
                 script_->Exited(std::chrono::milliseconds(0));
        },
        kClusterReady, std::chrono::milliseconds(500));
    if (!ready || Slurp(dir_ / "ha.out").find("ha ready") == std::string::npos) {
      throw std::runtime_error("scripts/ha did not get ready:\n" + Slurp(dir_ / "ha.out") +
                               Slurp(dir_ / "logs/pg1.log").substr(0, 4000));
    }
  }
  ~HaCluster() {
    script_->Signal(SIGTERM);
    if (!script_->Exited(std::chrono::seconds(120))) script_->Kill();
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "failover: cluster logs kept in %s\n", dir_.c_str());
    } else {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }

  std::string Url() const {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(base_ + 30) + "/postgres";
  }

  // The primary's data folder, asked through HAProxy ("" while there is none).
  std::string PrimaryDataDir() const {
    try {
      pqxx::connection c(Url() + "?connect_timeout=1");
      pqxx::nontransaction tx(c);
      auto row = tx.exec1("SELECT current_setting('data_directory'), pg_is_in_recovery()");
      return row[1].as<bool>() ? "" : row[0].as<std::string>();
    } catch (const std::exception&) {
      return "";
    }
  }

  // Whether every member runs, one leads and one is its synchronous standby (so the next
  // crash of the primary loses no acknowledged commit), by Patroni's REST /cluster.
  bool Healthy() const {
    for (int i = 0; i < 3; ++i) {
      httplib::Client c("127.0.0.1", base_ + 20 + i);
      c.set_connection_timeout(1);
      c.set_read_timeout(2);
      auto r = c.Get("/cluster");
      if (!r || r->status != 200) continue;
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      if (!j.is_object() || !j.contains("members")) continue;
      int running = 0;
      bool leader = false, sync = false;
      for (const auto& m : j["members"]) {
        std::string role = m.value("role", ""), state = m.value("state", "");
        bool up = state == "running" || state == "streaming";
        running += up ? 1 : 0;
        leader = leader || (role == "leader" && up);
        sync = sync || (role == "sync_standby" && up);
      }
      return running == 3 && leader && sync;
    }
    return false;
  }

 private:
  int base_;
  fs::path dir_;
  std::unique_ptr<chaos::Process> script_;
};

// Drives every record to its final answer, a few clients at a time.
void Settle(Driver& driver, std::vector<KeyRecord>& records) {
  auto deadline = Clock::now() + kSettle;
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (size_t i; (i = next++) < records.size();) {
        if (!records[i].final) driver.UntilFinal(records[i], deadline, t);
      }
    });
  }
  for (auto& t : ts) t.join();
}

// The postmaster's PID: the first line of postmaster.pid in its data folder.
pid_t PostmasterOf(const std::string& data_dir) {
  std::ifstream in(fs::path(data_dir) / "postmaster.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// Ports for one run: 31 from a base picked by this process (another run may hold others).
int BasePort() { return 20000 + static_cast<int>(getpid() % 200) * 40; }

TEST(Failover, KillingThePrimaryThreeTimesUnderLoadLosesNoOrderAndDoublesNoEffect) {
  idemsaga::common::SetLogEnabled(false);
  HaCluster ha(BasePort());
  ASSERT_TRUE(test_support::WaitFor([&] { return ha.Healthy(); }, kHealthy));
  Stack stack("failover", {.server_url = ha.Url()});
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  Driver driver({stack.OrchestratorUrl(0)});

  // Clients send new orders (one attempt each; retried in the settling below) until told to
  // stop, noting when each 201 was asked for and answered.
  std::mutex mutex;
  std::vector<KeyRecord> records;
  std::set<std::string> declined;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> created;  // sent, answered
  std::atomic<bool> stop{false};
  std::atomic<int> next{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      while (!stop) {
        int i = next++;
        KeyRecord r{"demo", "failover-" + std::to_string(i), chaos::OrderBody(i, i % 5 == 4)};
        auto sent = Clock::now();
        driver.Attempt(r, t);
        auto answered = Clock::now();
        std::lock_guard lock(mutex);
        if (r.statuses.count(201) != 0) created.emplace_back(sent, answered);
        if (i % 5 == 4) declined.insert(r.key);
        records.push_back(std::move(r));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }

  std::vector<double> recovery_seconds;
  std::string figures;
  for (int fault = 0; fault < kFaults; ++fault) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // orders in flight when it dies
    std::string victim = ha.PrimaryDataDir();
    ASSERT_FALSE(victim.empty()) << "no primary before fault " << fault + 1;
    pid_t postmaster = PostmasterOf(victim);
    ASSERT_GT(postmaster, 0);
    auto fault_at = Clock::now();
    ASSERT_EQ(kill(postmaster, SIGKILL), 0);
    ASSERT_TRUE(test_support::WaitFor(
        [&] {
          auto now = ha.PrimaryDataDir();
          return !now.empty() && now != victim;
        },
        kPromoted, std::chrono::milliseconds(100)))
        << "Patroni promoted no standby after fault " << fault + 1;
    auto promoted = std::chrono::duration<double>(Clock::now() - fault_at).count();
    // The first 201 of an order sent after the fault.
    ASSERT_TRUE(test_support::WaitFor(
        [&] {
          std::lock_guard lock(mutex);
          for (const auto& [sent, answered] : created) {
            if (sent >= fault_at) return true;
          }
          return false;
        },
        kPromoted, std::chrono::milliseconds(50)))
        << "no order was created after fault " << fault + 1;
    {
      std::lock_guard lock(mutex);
      double first = 1e9;
      for (const auto& [sent, answered] : created) {
        if (sent >= fault_at)
          first = std::min(first, std::chrono::duration<double>(answered - fault_at).count());
      }
      recovery_seconds.push_back(first);
      char line[160];
      std::snprintf(line, sizeof line, " fault%d_promoted_s=%.1f fault%d_first_201_s=%.1f",
                    fault + 1, promoted, fault + 1, first);
      figures += line;
    }
    // The next crash only once a synchronous standby holds every commit again.
    ASSERT_TRUE(test_support::WaitFor([&] { return ha.Healthy(); }, kHealthy))
        << "the cluster did not heal after fault " << fault + 1;
  }
  stop = true;
  for (auto& c : clients) c.join();

  long long delayed = 0;
  for (const auto& r : records) delayed += r.final ? 0 : 1;
  Settle(driver, records);
  long long failed = 0;
  for (const auto& r : records) {
    if (declined.count(r.key) == 0 && r.final_status != 201) ++failed;
  }
  auto report = chaos::CheckInvariants(stack, records);
  std::string line =
      report.Line("failover_kill_primary_x3", "failed=" + std::to_string(failed) +
                                                  " delayed=" + std::to_string(delayed) + figures);
  std::cout << line << std::endl;
  EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
  // A failover is an outage of seconds, not a refusal: an order is delayed, never failed.
  EXPECT_EQ(failed, 0) << line;
}

}  // namespace
