// docs/ha.md's first command, `./scripts/ha`, with the test build's binary (--binary; the
// release build is dev_script_itest's to check) and ports and a folder of its own: it must
// print its `ready` line, take an order through HAProxy on a primary with a synchronous
// standby, and on SIGINT stop everything it started: etcd, Patroni and its PostgreSQL
// servers, HAProxy, the services. This process is a child subreaper, so a server whose parent
// died stays its descendant: "no child left" after the script exits means nothing is left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "common/process.hpp"
#include "tests/support/children.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Bootstrap of three members (initdb, two base backups) on a busy 2-core machine.
constexpr auto kReadyDeadline = std::chrono::minutes(5);
// The services drain, then three Patroni members stop their servers, then etcd.
constexpr auto kStopDeadline = std::chrono::seconds(120);

using test_support::LiveChildren;
using test_support::SlurpFile;

bool Waited(pid_t pid, Clock::time_point deadline, int* status) {
  while (Clock::now() < deadline) {
    if (waitpid(pid, status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST(HaScript, ServesAnOrderThroughHAProxyAndCtrlCStopsEverythingItStarted) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  ASSERT_TRUE(LiveChildren().empty());
  std::string tmpl = (fs::temp_directory_path() / "ha-script-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const fs::path work = tmpl;
  fs::permissions(work, fs::perms::owner_all | fs::perms::others_exec | fs::perms::group_exec);
  const int base = 21000 + static_cast<int>(getpid() % 100) * 50;
  const fs::path out = work / "ha.out";

  pid_t script = fork();
  ASSERT_GE(script, 0);
  if (script == 0) {
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    prctl(PR_SET_PDEATHSIG, SIGINT);  // should this test die, what a Ctrl-C sends
    if (chdir(IDEMSAGA_SOURCE_DIR) != 0) _exit(127);
    std::string dir = (work / "ha").string(), port = std::to_string(base);
    execl("./scripts/ha", "./scripts/ha", "--dir", dir.c_str(), "--base-port", port.c_str(),
          "--binary", IDEMSAGA_BINARY, static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = Clock::now() + kReadyDeadline;
  bool ready = false;
  int status = 0;
  while (!ready && Clock::now() < deadline) {
    ready = SlurpFile(out).find("ha ready: http://127.0.0.1:") != std::string::npos;
    if (!ready && waitpid(script, &status, WNOHANG) == script) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(ready) << SlurpFile(out) << SlurpFile(work / "ha/logs/dev.log");

  // The orchestrator's database is on the primary behind HAProxy, and a standby is
  // synchronous: an acknowledged order is on two servers.
  const std::string haproxy = "postgresql://postgres@127.0.0.1:" + std::to_string(base + 30);
  {
    pqxx::connection c(haproxy + "/postgres");
    pqxx::nontransaction tx(c);
    EXPECT_FALSE(tx.exec1("SELECT pg_is_in_recovery()")[0].as<bool>());
    EXPECT_EQ(
        tx.exec1("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")[0].as<int>(),
        1);
  }
  httplib::Client client("127.0.0.1", base + 40);
  client.set_read_timeout(30);
  httplib::Headers headers = {{"Authorization", "Bearer dev-key-demo"},
                              {"Idempotency-Key", "ha-order-1"}};
  const std::string body =
      R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":1}],)"
      R"("amount_cents":1000,"currency":"USD","payment_method":"pm_card_visa"})";
  auto first = client.Post("/v1/orders", headers, body, "application/json");
  ASSERT_TRUE(first) << httplib::to_string(first.error());
  EXPECT_EQ(first->status, 201) << first->body;
  auto again = client.Post("/v1/orders", headers, body, "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->body, first->body);
  {
    pqxx::connection c(haproxy + "/idemsaga_orchestrator");
    pqxx::nontransaction tx(c);
    EXPECT_EQ(tx.exec1("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                       "'ha-order-1' AND status = 'completed'")[0]
                  .as<int>(),
              1);
  }
  client.stop();

  // Ctrl-C: the script stops what it started and exits; nothing of it is left.
  kill(script, SIGINT);
  ASSERT_TRUE(Waited(script, Clock::now() + kStopDeadline, &status)) << SlurpFile(out);
  EXPECT_NE(SlurpFile(out).find("ha: stopped"), std::string::npos) << SlurpFile(out);
  auto left = LiveChildren();
  for (auto until = Clock::now() + std::chrono::seconds(10); !left.empty() && Clock::now() < until;
       left = LiveChildren()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string names;
  for (const auto& c : left) names += std::to_string(c.pid) + " " + c.comm + "\n";
  EXPECT_TRUE(left.empty()) << "still running after the script exited:\n"
                            << names << SlurpFile(out);
  if (!::testing::Test::HasFailure()) fs::remove_all(work);
}

}  // namespace
