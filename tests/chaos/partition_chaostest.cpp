// Network partitions mid-saga, checked Jepsen-style. The orchestrator reaches payment and its
// own PostgreSQL through forwarders (partition.hpp) that the scenarios cut and heal; the
// participants, and the checks, reach everything directly. Under order load from clients that
// retry each key until its answer is final (giving up on an attempt after 3 s), every attempt
// is recorded in a history (history.hpp). Payment answers 200 ms after its commit, so that a cut
// finds sagas waiting on it: their charge done, its answer held in the partition.
//   partition_payment: orchestrator <-> payment cut for 8 s (the participant timeout is 2 s).
//   partition_postgres: orchestrator <-> PostgreSQL cut for 12 s (past the lease, and past
//     the server's idle-in-transaction timeout: a session cut inside a transaction is ended
//     by the server, and its COMMIT never arrives).
//   partition_flapping: both links cut and healed in turn, some heals by resetting every
//     connection (a peer restarted).
// After each, every key is settled, then the history checker (over every operation so far and
// the databases) and the fault suite's invariants with `idemsaga reconcile` must find nothing.
// Each scenario prints one line of figures (docs/testing.md keeps them).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/log.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/history.hpp"
#include "tests/chaos/partition.hpp"
#include "tests/support/wait.hpp"

namespace {

using chaos::Driver;
using chaos::Forwarder;
using chaos::History;
using chaos::KeyRecord;
using chaos::Stack;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---------------------------------------------------------------------------------------
// The forwarder itself, against a plain listening socket as its target.

// A socket listening on a free loopback port, and connections to it.
struct Target {
  Target() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
    listen(fd, 16);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
  }
  ~Target() { close(fd); }
  // The next connection the forwarder made, or -1 if none came within `wait`.
  int Accept(milliseconds wait) const {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(wait.count())) != 1) return -1;
    return accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  }
  int fd = -1;
  int port = 0;
};

// A client socket connecting to 127.0.0.1:`port` without waiting.
int ConnectNonBlocking(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  return fd;
}

bool Connected(int fd, milliseconds wait) {
  pollfd p{fd, POLLOUT, 0};
  int error = 0;
  socklen_t len = sizeof error;
  return poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
}

// What arrives on `fd` within `wait`: the bytes, "" for none, "<eof>" or "<errno N>".
std::string Receive(int fd, milliseconds wait) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(wait.count())) != 1) return "";
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n == 0) return "<eof>";
  if (n < 0) return "<errno " + std::to_string(errno) + ">";
  return std::string(buf, static_cast<size_t>(n));
}

void SendAll(int fd, const std::string& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// A healthy connection through `f` to `target`: {client's end, target's end}.
std::pair<int, int> Through(const Forwarder& f, const Target& target) {
  int client = ConnectNonBlocking(f.port());
  EXPECT_TRUE(Connected(client, seconds(5)));
  int server = target.Accept(seconds(5));
  EXPECT_GE(server, 0);
  return {client, server};
}

constexpr auto kSilence = milliseconds(700);  // how long "nothing arrives" is watched
constexpr auto kArrives = seconds(10);        // a bound on what must arrive (SYN retries: 1+2+4 s)

TEST(Forwarder, MovesBytesBothWaysWhenHealed) {
  Target target;
  Forwarder f(target.port);
  auto [client, server] = Through(f, target);
  SendAll(client, "ping");
  EXPECT_EQ(Receive(server, kArrives), "ping");
  SendAll(server, "pong");
  EXPECT_EQ(Receive(client, kArrives), "pong");
  close(client);
  EXPECT_EQ(Receive(server, kArrives), "<eof>") << "a FIN is passed on";
  close(server);
  EXPECT_EQ(f.connections(), 1);
  EXPECT_EQ(f.bytes(), 8);
}

TEST(Forwarder, PartitionedMovesNothingAnswersNoNewConnectionAndResetsNoneThenHealResumesBoth) {
  Target target;
  Forwarder f(target.port);
  auto [client, server] = Through(f, target);
  f.Partition();
  EXPECT_TRUE(f.partitioned());
  SendAll(client, "held");
  SendAll(server, "back");
  EXPECT_EQ(Receive(server, kSilence), "") << "a byte crossed the partition";
  EXPECT_EQ(Receive(client, kSilence), "") << "a byte crossed the partition, or an RST";
  // A new connection is neither accepted nor refused: its SYN goes unanswered.
  int late = ConnectNonBlocking(f.port());
  EXPECT_FALSE(Connected(late, kSilence)) << "a new connection got through the partition";
  int error = 0;
  socklen_t len = sizeof error;
  getsockopt(late, SOL_SOCKET, SO_ERROR, &error, &len);
  EXPECT_EQ(error, 0) << "the partition refused or reset a connection (errno " << error << ")";
  EXPECT_EQ(target.Accept(milliseconds(0)), -1);
  f.Heal();
  EXPECT_EQ(Receive(server, kArrives), "held") << "what waited in the partition flows on heal";
  EXPECT_EQ(Receive(client, kArrives), "back");
  // The waiting SYN gets through on its next retransmission.
  EXPECT_TRUE(Connected(late, kArrives));
  int late_server = target.Accept(kArrives);
  ASSERT_GE(late_server, 0);
  SendAll(late, "new");
  EXPECT_EQ(Receive(late_server, kArrives), "new");
  for (int fd : {client, server, late, late_server}) close(fd);
}

TEST(Forwarder, ResetEndsEveryOpenConnectionWithAnRstOnBothEnds) {
  Target target;
  Forwarder f(target.port);
  auto [client, server] = Through(f, target);
  f.Reset();
  EXPECT_EQ(Receive(client, kArrives), "<errno " + std::to_string(ECONNRESET) + ">");
  EXPECT_EQ(Receive(server, kArrives), "<errno " + std::to_string(ECONNRESET) + ">");
  auto [again, again_server] = Through(f, target);  // and it forwards on
  SendAll(again, "after");
  EXPECT_EQ(Receive(again_server, kArrives), "after");
  for (int fd : {client, server, again, again_server}) close(fd);
}

// ---------------------------------------------------------------------------------------
// Partitions mid-saga.

constexpr auto kSettle = seconds(90);
constexpr auto kLoadBeforeCut = seconds(3);
constexpr auto kLoadAfterHeal = seconds(4);
constexpr int kClients = 4;
// A client gives up on an attempt after this and retries the key: cuts leave indeterminate
// operations, and duplicates of sagas still running.
constexpr auto kClientTimeout = seconds(3);
// Payment's answers wait this long after its commit (ms): a cut finds sagas waiting on it.
constexpr int kPaymentLatencyMs = 200;

// Clients that each send orders one after another, retrying each key (the same body) until
// its answer is final or the load stops; Settle finishes the rest.
class RetryingLoad {
 public:
  RetryingLoad(Driver& driver, const std::string& prefix) {
    for (int t = 0; t < kClients; ++t) {
      clients_.emplace_back([this, &driver, prefix, t] {
        while (!stop_) {
          int i = next_++;
          KeyRecord r{"demo", prefix + std::to_string(i), chaos::OrderBody(i, i % 5 == 4)};
          while (!driver.Attempt(r, t) && !stop_) std::this_thread::sleep_for(milliseconds(100));
          std::lock_guard lock(mutex_);
          records_.push_back(std::move(r));
        }
      });
    }
  }
  ~RetryingLoad() { Stop(); }
  void Stop() {
    stop_ = true;
    for (auto& c : clients_) {
      if (c.joinable()) c.join();
    }
  }
  std::vector<KeyRecord>& records() { return records_; }  // once stopped

 private:
  std::mutex mutex_;
  std::vector<KeyRecord> records_;
  std::atomic<bool> stop_{false};
  std::atomic<int> next_{0};
  std::vector<std::thread> clients_;
};

std::string Seconds(const char* name, long long us) {
  char out[64];
  std::snprintf(out, sizeof out, " %s=%.1f", name, us < 0 ? -1.0 : us / 1e6);
  return out;
}

class Partitions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    idemsaga::common::SetLogEnabled(false);
    try {
      stack_ = std::make_unique<Stack>("partition");
      stack_->StartParticipants();
      stack_->SetFaults("payment", {{"latency_ms", kPaymentLatencyMs}});
      payment_ = std::make_unique<Forwarder>(stack_->ParticipantPort("payment"));
      postgres_ = std::make_unique<Forwarder>(stack_->ServerPort());
      stack_->RouteOrchestrator("payment", payment_->port());
      stack_->RouteOrchestrator(chaos::kDatabaseServer, postgres_->port());
      stack_->StartOrchestrator(0);
      driver_ = std::make_unique<Driver>(std::vector<std::string>{stack_->OrchestratorUrl(0)});
      driver_->SetHistory(&history_);
      driver_->SetReadTimeout(kClientTimeout);
    } catch (const std::exception& e) {
      setup_error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    driver_.reset();
    stack_.reset();
    payment_.reset();
    postgres_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(driver_) << setup_error_;
    first_event_ = history_.events().size();
  }
  void TearDown() override {
    // A failed scenario leaves no link cut for the next.
    if (payment_) payment_->Heal();
    if (postgres_) postgres_->Heal();
  }

  // Operations invoked before `at_us` and not answered by then: sagas the cut caught.
  static long long InFlightAt(const std::vector<chaos::Event>& events, long long at_us) {
    std::set<long long> open;
    for (const auto& e : events) {
      if (e.at_us >= at_us) break;
      if (e.type == chaos::Event::Type::kInvoke) {
        open.insert(e.op);
      } else {
        open.erase(e.op);
      }
    }
    return static_cast<long long>(open.size());
  }

  // Settles the load's keys, checks the history and the invariants over everything so far,
  // prints the scenario's figures and expects every count at 0.
  void Finish(const std::string& scenario, RetryingLoad& load, long long cut_us, long long heal_us,
              const std::string& figures) {
    load.Stop();
    auto& records = load.records();
    chaos::Settle(*driver_, records, kSettle);
    all_.insert(all_.end(), records.begin(), records.end());
    auto events = history_.events();
    auto violations = chaos::CheckHistory(events, chaos::KeyStates(*stack_));
    auto report = chaos::CheckInvariants(*stack_, all_);
    // This scenario's own operations.
    std::vector<chaos::Event> mine(events.begin() + static_cast<long>(first_event_), events.end());
    std::map<int, int> statuses;
    long long indeterminate = 0, first_201_us = -1;
    for (const auto& e : mine) {
      if (e.type == chaos::Event::Type::kInfo) ++indeterminate;
      if (e.type != chaos::Event::Type::kComplete) continue;
      ++statuses[e.status];
      if (e.status == 201 && e.at_us >= heal_us && first_201_us < 0) first_201_us = e.at_us;
    }
    long long created = 0, failed = 0, failed_declined = 0;
    for (const auto& r : records) {
      created += r.final_status == 201;
      bool declined = chaos::SagaOutcome(r.final_body) == "failed";
      failed += declined;
      failed_declined += declined && r.body.find("pm_card_declined") != std::string::npos;
    }
    std::string status_list;
    for (const auto& [status, n] : statuses) {
      status_list +=
          (status_list.empty() ? "" : ",") + std::to_string(status) + ":" + std::to_string(n);
    }
    long long in_flight = InFlightAt(mine, cut_us);
    std::string line = report.Line(
        scenario,
        "keys=" + std::to_string(records.size()) + " created=" + std::to_string(created) +
            " failed=" + std::to_string(failed) + " failed_not_declined=" +
            std::to_string(failed - failed_declined) + " ops=" + std::to_string(mine.size() / 2) +
            " indeterminate_ops=" + std::to_string(indeterminate) + " statuses=" + status_list +
            " in_flight_at_cut=" + std::to_string(in_flight) +
            Seconds("heal_to_first_201_s", first_201_us < 0 ? -1 : first_201_us - heal_us) +
            figures + " " + violations.Line());
    std::cout << line << std::endl;
    EXPECT_EQ(violations.Total(), 0) << line << "\n"
                                     << ::testing::PrintToString(violations.examples);
    EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
    EXPECT_GT(in_flight, 0) << "the cut caught no saga mid-way";
    EXPECT_GE(first_201_us, 0) << "no order was created after the heal";
  }

  // Load, then `link` cut for `cut` and healed, then load on.
  void CutAndHeal(const std::string& scenario, Forwarder& link, Clock::duration cut) {
    RetryingLoad load(*driver_, scenario + "-");
    std::this_thread::sleep_for(kLoadBeforeCut);
    long long cut_us = history_.Now();
    link.Partition();
    std::this_thread::sleep_for(cut);
    long long heal_us = history_.Now();
    link.Heal();
    std::this_thread::sleep_for(kLoadAfterHeal);
    Finish(scenario, load, cut_us, heal_us,
           Seconds("cut_s", heal_us - cut_us) +
               " link_connections=" + std::to_string(link.connections()));
  }

  static inline std::unique_ptr<Stack> stack_;
  static inline std::unique_ptr<Forwarder> payment_, postgres_;
  static inline std::unique_ptr<Driver> driver_;
  static inline History history_;
  static inline std::vector<KeyRecord> all_;  // every scenario's keys, settled
  static inline std::string setup_error_;
  size_t first_event_ = 0;
};

TEST_F(Partitions, CuttingPaymentMidSagaForLongerThanItsTimeoutDoublesNoChargeAndLosesNoOrder) {
  CutAndHeal("partition_payment", *payment_, seconds(8));
}

TEST_F(Partitions, CuttingPostgresMidSagaDoublesNoEffectAndLosesNoAnswer) {
  CutAndHeal("partition_postgres", *postgres_, seconds(12));
}

TEST_F(Partitions, FlappingLinksToPaymentAndPostgresDoubleNoEffect) {
  RetryingLoad load(*driver_, "partition_flapping-");
  std::this_thread::sleep_for(kLoadBeforeCut);
  long long cut_us = history_.Now(), heal_us = 0;
  int resets = 0;
  for (int round = 0; round < 6; ++round) {
    Forwarder& link = round % 2 == 0 ? *payment_ : *postgres_;
    link.Partition();
    std::this_thread::sleep_for(milliseconds(1500));
    heal_us = history_.Now();
    if (round % 3 == 2) {
      link.Reset();  // healed by a restart: every open connection gets an RST
      ++resets;
    } else {
      link.Heal();
    }
    std::this_thread::sleep_for(milliseconds(1000));
  }
  std::this_thread::sleep_for(kLoadAfterHeal);
  Finish("partition_flapping", load, cut_us, heal_us, " cuts=6 resets=" + std::to_string(resets));
}

}  // namespace
