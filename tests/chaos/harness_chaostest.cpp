// The chaos harness leaves nothing behind when its test process dies: a harness that holds a
// running stack (an orchestrator, three participants, its private PostgreSQL) is killed with
// SIGKILL, as a CTest timeout does, and all of it must be gone within a deadline. And a
// sanitizer report that only a server's log holds still fails the test.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/pg/cluster.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/wait.hpp"

namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

// Where the victim writes what it started; set only in the victim's environment.
constexpr const char* kVictimReport = "IDEMSAGA_CHAOS_VICTIM_REPORT";

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Whether `pid` is a running process whose command line holds `needle`. A zombie is not: it
// has ended and only waits for its new parent to reap it.
bool Running(pid_t pid, const std::string& needle) {
  std::string proc = "/proc/" + std::to_string(pid);
  std::string stat = Slurp(proc + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos || (stat.size() > close + 2 && stat[close + 2] == 'Z')) {
    return false;
  }
  std::string cmdline = Slurp(proc + "/cmdline");
  for (char& c : cmdline) c = c == '\0' ? ' ' : c;
  return cmdline.find(needle) != std::string::npos;
}

// The first line of the cluster's postmaster.pid.
pid_t PostmasterPid(const fs::path& cluster) {
  std::ifstream in(cluster / "data" / "postmaster.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

struct Started {
  std::vector<pid_t> servers;  // idemsaga processes
  pid_t postmaster = 0;
  fs::path cluster, logs;
};

Started ReadReport(const fs::path& report) {
  Started s;
  std::istringstream in(Slurp(report));
  std::string what, value;
  while (in >> what >> value) {
    if (what == "server") s.servers.push_back(std::stoi(value));
    if (what == "postmaster") s.postmaster = std::stoi(value);
    if (what == "cluster") s.cluster = value;
    if (what == "logs") s.logs = value;
  }
  return s;
}

// The victim: not a test of its own, but the harness process that the test below kills.
TEST(ChaosHarnessVictim, HoldsARunningStackUntilKilled) {
  const char* report = std::getenv(kVictimReport);
  if (report == nullptr)
    GTEST_SKIP() << "runs only as the child of AKilledHarnessLeavesNoServersAndNoClusterBehind";
  chaos::Stack stack("victim");
  stack.StartParticipants();
  stack.StartOrchestrator(0);
  const fs::path cluster = chaos::Stack::ClusterDir();
  {
    std::ofstream out(std::string(report) + ".tmp");
    out << "server " << stack.orchestrator(0).pid() << "\n";
    for (const auto& which : chaos::kParticipants)
      out << "server " << stack.participant(which).pid() << "\n";
    out << "postmaster " << PostmasterPid(cluster) << "\n"
        << "cluster " << cluster.string() << "\n"
        << "logs " << stack.log_dir() << "\n";
  }
  fs::rename(std::string(report) + ".tmp", report);  // appears whole
  for (;;) pause();
}

TEST(ChaosHarness, AKilledHarnessLeavesNoServersAndNoClusterBehind) {
  const fs::path dir = idemsaga::common::pg::PrivateCluster::MakeTempDir();
  const fs::path report = dir / "started", log = dir / "victim.log";
  chaos::Process victim(
      {fs::read_symlink("/proc/self/exe").string(), "--gtest_filter=ChaosHarnessVictim.*"},
      {{kVictimReport, report.string()}}, log.string());
  ASSERT_TRUE(test_support::WaitFor(
      [&] { return fs::exists(report) || victim.Exited(std::chrono::milliseconds(0)); },
      seconds(180)));
  ASSERT_TRUE(fs::exists(report)) << "the victim did not start its stack:\n" << Slurp(log);
  Started started = ReadReport(report);
  ASSERT_EQ(started.servers.size(), 1 + chaos::kParticipants.size()) << Slurp(report);
  ASSERT_GT(started.postmaster, 0) << Slurp(report);
  ASSERT_FALSE(started.cluster.empty()) << Slurp(report);
  ASSERT_FALSE(started.logs.empty()) << Slurp(report);
  const std::string data = (started.cluster / "data").string();
  for (pid_t pid : started.servers) ASSERT_TRUE(Running(pid, IDEMSAGA_BINARY)) << pid;
  ASSERT_TRUE(Running(started.postmaster, data)) << started.postmaster;

  victim.Kill();  // SIGKILL: no destructor, no handler runs in the victim

  auto left = [&] {
    std::string out;
    for (pid_t pid : started.servers) {
      if (Running(pid, IDEMSAGA_BINARY)) out += " idemsaga:" + std::to_string(pid);
    }
    if (Running(started.postmaster, data))
      out += " postmaster:" + std::to_string(started.postmaster);
    if (fs::exists(started.cluster)) out += " cluster:" + started.cluster.string();
    return out;
  };
  EXPECT_TRUE(test_support::WaitFor([&] { return left().empty(); }, seconds(20)))
      << "left behind:" << left();

  // Whatever the harness failed to end, this test ends, so that a failure leaves nothing.
  for (pid_t pid : started.servers) {
    if (Running(pid, IDEMSAGA_BINARY)) kill(pid, SIGKILL);
  }
  if (Running(started.postmaster, data)) {
    kill(started.postmaster, SIGQUIT);  // immediate shutdown
    test_support::WaitFor([&] { return !Running(started.postmaster, data); }, seconds(20));
  }
  fs::remove_all(started.cluster);
  fs::remove_all(started.logs);
  fs::remove_all(dir);
}

// A server's sanitizer report goes to its log, not to this process: the harness reads the
// logs when a stack ends and fails the test for any report it finds.
TEST(ChaosHarness, ASanitizerReportInAServersLogFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(
      {
        chaos::Stack stack("sanitizer_report");
        std::ofstream(stack.log_dir() + "/payment.log")
            << "payment ready\n../../steps/guard/guard.cpp:1:1: runtime error: signed integer "
               "overflow\n";
      },
      "sanitizer report in");
}

}  // namespace
