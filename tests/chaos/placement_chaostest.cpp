// Tenants on several PostgreSQL clusters (docs/scaling.md): three private clusters, a cell on
// each (an orchestrator, the inventory, payment and shipping participants, their databases on
// that cluster only), six tenants placed two per cluster in a directory database (on the
// first cluster), and a front that routes each tenant's orders to its cell as the directory
// says (and looks again when a cell answers 503).
//
// 1. A cluster is killed (immediate shutdown) under order load on every tenant: its tenants'
//    orders are answered 503 + Retry-After and nothing is stored for a refused one; every
//    other tenant's order is answered as usual; once it is back, every order, retried with
//    its own key, ends exactly once.
// 2. A tenant is moved to another cluster under load (`idemsaga tenant move`), with its sagas
//    slowed so that some are running when the drain begins: afterwards every key of the
//    tenant replays the same bytes from the new cluster, nothing of it is left on or served
//    from the old one, and the other tenants were served throughout.
// The fault suite's invariants (chaos_harness.hpp) and `idemsaga reconcile` hold on every
// cluster after each. Prints one line of figures per phase.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <pqxx/pqxx>
#include <thread>

#include "common/crypto.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "common/placement.hpp"
#include "common/process.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/wait.hpp"

namespace {

using chaos::Driver;
using chaos::KeyRecord;
using chaos::Stack;
using chaos::WatchedCluster;
using Clock = std::chrono::steady_clock;

constexpr int kClusters = 3;
const std::vector<std::string> kTenants = {"t0", "t1", "t2", "t3", "t4", "t5"};
constexpr int kKilled = 2;        // the cluster killed in phase 1 (not the directory's)
const std::string kMoved = "t0";  // moved in phase 2, from c0 to c1
constexpr auto kOutage = std::chrono::seconds(6);

std::string ClusterName(int i) { return "c" + std::to_string(i); }
int HomeOf(const std::string& tenant) { return (tenant[1] - '0') / 2; }

// The three cells and the directory.
class Cells {
 public:
  Cells() {
    for (int i = 0; i < kClusters; ++i) {
      pg_.push_back(std::make_unique<WatchedCluster>(/*durable=*/false));
    }
    auto server = pg_[0]->cluster().Url("postgres");
    idemsaga::common::pg::CreateDatabaseIfMissing(server, "placement_directory");
    directory_ = idemsaga::common::pg::WithDatabase(server, "placement_directory");
    pqxx::connection conn(directory_);
    idemsaga::common::pg::Migrate(conn, "directory");
    for (const auto& t : kTenants) {
      int rc =
          idemsaga::common::RunProgram({IDEMSAGA_BINARY, "tenant", "place", t, "--placement-url",
                                        directory_, "--cluster", ClusterName(HomeOf(t))});
      if (rc != 0) throw std::runtime_error("tenant place failed for " + t);
    }
    for (int i = 0; i < kClusters; ++i) {
      std::vector<std::string> placement = {"--placement-url", directory_, "--cluster",
                                            ClusterName(i)};
      stacks_.push_back(std::make_unique<Stack>(
          "placement_" + ClusterName(i),
          chaos::StackOptions{.orchestrator_args = placement,
                              .participant_args = placement,
                              .server_url = pg_[i]->cluster().Url("postgres")}));
      // Every cell knows every tenant's credentials: a client that reaches the wrong cell is
      // told where its tenant is, not that its key is unknown.
      pqxx::connection orch(stacks_[i]->DatabaseUrl("orchestrator"));
      pqxx::work tx(orch);
      for (const auto& t : kTenants) {
        tx.exec_params("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ($1, $2)", t,
                       idemsaga::common::Sha256Hex("dev-key-" + t));
      }
      tx.commit();
      stacks_[i]->StartParticipants();
      stacks_[i]->StartOrchestrator(0);
      drivers_.push_back(std::make_unique<Driver>(std::vector{stacks_[i]->OrchestratorUrl(0)}));
    }
  }

  Stack& stack(int i) { return *stacks_[i]; }
  idemsaga::common::pg::PrivateCluster& pg(int i) { return pg_[i]->cluster(); }
  const std::string& directory() const { return directory_; }

  // The cell the directory places `tenant` on.
  int Placed(const std::string& tenant) {
    pqxx::connection conn(directory_);
    pqxx::read_transaction tx(conn);
    auto c = tx.exec_params1("SELECT cluster FROM tenant_placement WHERE tenant_id = $1", tenant);
    return c[0].as<std::string>()[1] - '0';
  }

  // The front: one attempt at the tenant's cell; after a 503 it asks the directory again.
  bool Attempt(KeyRecord& r, std::map<std::string, int>& routes) {
    auto it = routes.find(r.tenant);
    if (it == routes.end()) it = routes.emplace(r.tenant, Placed(r.tenant)).first;
    auto unavailable = [&] {
      auto n = r.statuses.find(503);
      return n == r.statuses.end() ? 0 : n->second;
    };
    int before = unavailable();
    bool final = drivers_[it->second]->Attempt(r, 0);
    if (unavailable() != before) it->second = Placed(r.tenant);
    return final;
  }

  // Drives every record to its final answer, each retried with its own key.
  void Settle(std::vector<KeyRecord>& records, std::chrono::seconds within) {
    auto deadline = Clock::now() + within;
    std::atomic<size_t> next{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&] {
        std::map<std::string, int> routes;
        for (size_t i; (i = next++) < records.size();) {
          while (!records[i].final && Clock::now() < deadline) {
            if (!Attempt(records[i], routes))
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
      });
    }
    for (auto& t : ts) t.join();
  }

 private:
  std::vector<std::unique_ptr<WatchedCluster>> pg_;
  std::string directory_;
  std::vector<std::unique_ptr<Stack>> stacks_;
  std::vector<std::unique_ptr<Driver>> drivers_;
};

// What one attempt of a new order saw: when it was sent and answered, and how.
struct Sent {
  std::string tenant;
  Clock::time_point at, answered;
  int status = 0;
};

// Clients that send new orders of every tenant in turn, one attempt each (Settle finishes
// them), until stopped.
class OrderLoad {
 public:
  OrderLoad(Cells& cells, std::string prefix) : cells_(cells), prefix_(std::move(prefix)) {
    for (int t = 0; t < 3; ++t) {
      clients_.emplace_back([this] {
        std::map<std::string, int> routes;
        while (!stop_) {
          int i = next_++;
          KeyRecord r{kTenants[i % kTenants.size()], prefix_ + std::to_string(i),
                      chaos::OrderBody(i, i % 7 == 6)};
          Sent s{r.tenant, Clock::now(), {}, 0};
          cells_.Attempt(r, routes);
          s.answered = Clock::now();
          s.status = r.statuses.begin()->first;  // its one attempt's
          std::lock_guard lock(mutex_);
          sent_.push_back(s);
          records_.push_back(std::move(r));
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
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
  std::vector<KeyRecord>& records() { return records_; }
  const std::vector<Sent>& sent() const { return sent_; }

 private:
  Cells& cells_;
  std::string prefix_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_{0};
  std::mutex mutex_;
  std::vector<KeyRecord> records_;
  std::vector<Sent> sent_;
  std::vector<std::thread> clients_;
};

httplib::Result PostOrder(const std::string& url, const std::string& tenant, const std::string& key,
                          int i) {
  httplib::Client c(url);
  c.set_read_timeout(15);
  return c.Post("/v1/orders",
                {{"Authorization", "Bearer dev-key-" + tenant}, {"Idempotency-Key", key}},
                chaos::OrderBody(i, false), "application/json");
}

long long Count(const std::string& url, const std::string& sql, const std::string& tenant) {
  pqxx::connection conn(url);
  pqxx::read_transaction tx(conn);
  return tx.exec_params1(sql, tenant)[0].as<long long>();
}

// The invariants on every cluster, each over the records of the tenants it holds now.
void CheckEveryCluster(Cells& cells, const std::vector<KeyRecord>& records,
                       const std::string& phase) {
  std::map<std::string, int> placed;
  for (const auto& t : kTenants) placed[t] = cells.Placed(t);
  for (int c = 0; c < kClusters; ++c) {
    std::vector<KeyRecord> mine;
    for (const auto& r : records) {
      if (placed[r.tenant] == c) mine.push_back(r);
    }
    auto report = chaos::CheckInvariants(cells.stack(c), mine);
    std::cout << report.Line(phase + "_" + ClusterName(c)) << std::endl;
    EXPECT_TRUE(report.Clean()) << report.reconcile_report;
  }
}

TEST(PlacementChaos, AKilledClusterStopsOnlyItsTenantsAndATenantMovesUnderLoadWithNoDoubleEffect) {
  Cells cells;
  std::vector<KeyRecord> all;

  // 1. Kill a cluster under load.
  {
    OrderLoad load(cells, "kill-");
    std::this_thread::sleep_for(std::chrono::seconds(3));
    cells.pg(kKilled).Crash();
    auto killed_at = Clock::now();  // an order sent before it may still have been served
    std::this_thread::sleep_for(std::chrono::seconds(2));
    // A refused order of the killed cluster's tenant: 503, Retry-After, nothing stored.
    auto refused = PostOrder(cells.stack(kKilled).OrchestratorUrl(0), "t4", "kill-probe", 9001);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 503) << refused->body;
    EXPECT_TRUE(refused->has_header("Retry-After"));
    std::this_thread::sleep_for(kOutage - std::chrono::seconds(2));
    auto restarted_at = Clock::now();
    cells.pg(kKilled).Restart();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    load.Stop();
    EXPECT_EQ(
        Count(cells.stack(kKilled).DatabaseUrl("orchestrator"),
              "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1", "kill-probe"),
        0);
    // During the outage: the killed cluster's tenants wait, the others are served.
    long long theirs = 0, theirs_503 = 0, others = 0, others_answered = 0, others_5xx = 0;
    for (const auto& s : load.sent()) {
      if (s.at < killed_at || s.answered > restarted_at) continue;
      if (HomeOf(s.tenant) == kKilled) {
        ++theirs;
        theirs_503 += s.status == 503 ? 1 : 0;
      } else {
        ++others;
        others_answered += s.status / 100 == 2 || s.status / 100 == 4 ? 1 : 0;
        others_5xx += s.status / 100 == 5 || s.status == 0 ? 1 : 0;
      }
    }
    auto& records = load.records();
    KeyRecord probe{"t4", "kill-probe", chaos::OrderBody(9001, false)};
    records.push_back(probe);
    cells.Settle(records, std::chrono::seconds(90));
    std::cout << "placement_kill: killed_tenants_orders=" << theirs
              << " answered_503=" << theirs_503 << " other_tenants_orders=" << others
              << " answered=" << others_answered << " answered_5xx_or_none=" << others_5xx
              << std::endl;
    EXPECT_GT(theirs, 0);
    EXPECT_EQ(theirs_503, theirs);
    EXPECT_GT(others, 0);
    EXPECT_EQ(others_5xx, 0);
    EXPECT_EQ(others_answered, others);
    all.insert(all.end(), records.begin(), records.end());
    CheckEveryCluster(cells, all, "placement_kill");
  }

  // 2. Move t0 from c0 to c1 under load, its sagas slowed so that some run when it drains.
  {
    // Below the orchestrator's participant timeout (2 s): slow, not failing.
    cells.stack(0).SetFaults("payment", {{"latency_ms", 1500}});
    OrderLoad load(cells, "move-");
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::vector<std::string> argv = {
        IDEMSAGA_BINARY,   "tenant",          "move", kMoved, "--to", "c1", "--placement-url",
        cells.directory(), "--drain-timeout", "60s"};
    for (const auto& kind : idemsaga::common::pg::DatabaseKinds()) {
      argv.insert(argv.end(), {"--from-database", cells.stack(0).DatabaseUrl(kind), "--to-database",
                               cells.stack(1).DatabaseUrl(kind)});
    }
    std::string out = ::testing::TempDir() + "tenant-move.log";
    // Orders of the tenant in flight when the drain begins: the move waits for them.
    std::vector<KeyRecord> in_flight;
    for (int i = 0; i < 3; ++i) {
      in_flight.push_back(
          {kMoved, "move-in-flight-" + std::to_string(i), chaos::OrderBody(i, false)});
    }
    std::vector<Clock::time_point> in_flight_answered(in_flight.size());
    std::vector<std::thread> senders;
    for (size_t i = 0; i < in_flight.size(); ++i) {
      senders.emplace_back([&, i] {
        std::map<std::string, int> routes;
        cells.Attempt(in_flight[i], routes);
        in_flight_answered[i] = Clock::now();
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto began = Clock::now();
    int rc = idemsaga::common::RunProgram(argv, out);
    for (auto& t : senders) t.join();
    long long ran_into_drain = 0;
    for (auto at : in_flight_answered) ran_into_drain += at > began ? 1 : 0;
    auto ended = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    load.Stop();
    cells.stack(0).SetFaults("payment", {{"latency_ms", 0}});
    std::string moved = idemsaga::common::ReadProgramOutput({"tail", "-n", "1", out});
    ASSERT_EQ(rc, 0) << idemsaga::common::ReadProgramOutput({"cat", out});
    EXPECT_EQ(cells.Placed(kMoved), 1);

    long long moved_orders = 0, moved_503 = 0, others = 0, others_5xx = 0;
    for (const auto& s : load.sent()) {
      if (s.at < began || s.answered > ended) continue;
      if (s.tenant == kMoved) {
        ++moved_orders;
        moved_503 += s.status == 503 ? 1 : 0;
      } else {
        ++others;
        others_5xx += s.status / 100 == 5 || s.status == 0 ? 1 : 0;
      }
    }
    auto& records = load.records();
    records.insert(records.end(), in_flight.begin(), in_flight.end());
    cells.Settle(records, std::chrono::seconds(90));
    all.insert(all.end(), records.begin(), records.end());

    // Every key of the moved tenant, both phases', replays its answer byte for byte from c1.
    long long replays = 0, replay_mismatch = 0;
    std::map<std::string, int> routes;
    for (const auto& r : all) {
      if (r.tenant != kMoved || !r.final) continue;
      KeyRecord again{r.tenant, r.key, r.body};
      cells.Attempt(again, routes);
      ++replays;
      replay_mismatch += again.final_body == r.final_body ? 0 : 1;
    }
    // Nothing of it is left on c0, and c0 serves none of it, naming where it went.
    long long left = 0;
    for (const auto& kind : idemsaga::common::pg::DatabaseKinds()) {
      left += Count(cells.stack(0).DatabaseUrl(kind),
                    "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1", kMoved);
    }
    left += Count(cells.stack(0).DatabaseUrl("payment"),
                  "SELECT count(*) FROM charges WHERE tenant_id = $1", kMoved);
    left += Count(cells.stack(0).DatabaseUrl("inventory"),
                  "SELECT count(*) FROM reservations WHERE tenant_id = $1", kMoved);
    auto stale = PostOrder(cells.stack(0).OrchestratorUrl(0), kMoved, "stale-probe", 0);
    ASSERT_TRUE(stale);
    EXPECT_EQ(stale->status, 503);
    EXPECT_EQ(stale->get_header_value(idemsaga::common::kTenantClusterHeader), "c1");

    std::cout << "placement_move: " << moved
              << " move_s=" << std::chrono::duration<double>(ended - began).count()
              << " in_flight_at_drain=" << ran_into_drain << " moved_tenant_orders=" << moved_orders
              << " answered_503=" << moved_503 << " other_tenants_orders=" << others
              << " answered_5xx_or_none=" << others_5xx << " replays=" << replays
              << " replay_mismatch=" << replay_mismatch << " rows_left_on_c0=" << left << std::endl;
    EXPECT_EQ(ran_into_drain, static_cast<long long>(in_flight.size()));
    EXPECT_GT(replays, 0);
    EXPECT_EQ(replay_mismatch, 0);
    EXPECT_EQ(left, 0);
    EXPECT_GT(others, 0);
    EXPECT_EQ(others_5xx, 0);
    CheckEveryCluster(cells, all, "placement_move");
  }
}

}  // namespace
