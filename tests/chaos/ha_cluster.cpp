#include "tests/chaos/ha_cluster.hpp"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <sstream>
#include <stdexcept>

#include "common/pg/cluster.hpp"
#include "tests/support/children.hpp"
#include "tests/support/wait.hpp"

namespace chaos {
namespace {

namespace fs = std::filesystem;

// Bootstrap of three members (initdb, two base backups) on a busy 2-core machine.
constexpr auto kClusterReady = std::chrono::minutes(4);

// Patroni's /cluster from the first member that answers (null if none does).
nlohmann::json ClusterJson(int base) {
  for (int i = 0; i < 3; ++i) {
    httplib::Client c("127.0.0.1", base + 20 + i);
    c.set_connection_timeout(1);
    c.set_read_timeout(2);
    auto r = c.Get("/cluster");
    if (!r || r->status != 200) continue;
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    if (j.is_object() && j.contains("members")) return j;
  }
  return nullptr;
}

// A process's arguments, split at the NULs of /proc/<pid>/cmdline.
std::vector<std::string> Arguments(const fs::path& proc) {
  std::ifstream in(proc / "cmdline", std::ios::binary);
  std::vector<std::string> out;
  for (std::string arg; std::getline(in, arg, '\0');) out.push_back(arg);
  return out;
}

// The process running `program` (directly or as the script its interpreter runs) with `arg`
// among its arguments; -1 if none.
pid_t ProcessWithArgument(const std::string& program, const std::string& arg) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto args = Arguments(entry.path());
    bool runs = false, has = false;
    for (size_t i = 0; i < args.size(); ++i) {
      runs = runs || (i < 2 && fs::path(args[i]).filename() == program);
      has = has || (i > 0 && args[i] == arg);
    }
    if (runs && has) return std::stoi(name);
  }
  return -1;
}

}  // namespace

HaCluster::HaCluster(int base_port) : base_(base_port) {
  dir_ = fs::canonical(idemsaga::common::pg::PrivateCluster::MakeTempDir());
  // As root Patroni runs as `postgres`, which must enter the folder (else the script puts
  // the members under /var/lib/idemsaga, which this test would leave behind).
  chmod(dir_.c_str(), 0755);
  script_ = std::make_unique<Process>(
      std::vector<std::string>{"/bin/bash", std::string(IDEMSAGA_SOURCE_DIR) + "/scripts/ha",
                               "--db-only", "--dir", dir_.string(), "--base-port",
                               std::to_string(base_)},
      std::map<std::string, std::string>{}, (dir_ / "ha.out").string());
  auto ready = [&] {
    return test_support::SlurpFile(dir_ / "ha.out").find("ha ready") != std::string::npos;
  };
  test_support::WaitFor([&] { return ready() || script_->Exited(std::chrono::milliseconds(0)); },
                        kClusterReady, std::chrono::milliseconds(500));
  if (!ready()) {
    keep_ = true;
    throw std::runtime_error("scripts/ha did not get ready:\n" +
                             test_support::SlurpFile(dir_ / "ha.out") +
                             test_support::SlurpFile(dir_ / "logs/pg1.log").substr(0, 4000));
  }
}

HaCluster::~HaCluster() {
  script_->Signal(SIGTERM);
  if (!script_->Exited(std::chrono::seconds(120))) script_->Kill();
  if (keep_) {
    std::fprintf(stderr, "failover: cluster logs kept in %s\n", dir_.c_str());
  } else {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

std::string HaCluster::Url() const { return MemberUrl(base_ + 30); }

std::string HaCluster::MemberUrl(int port) const {
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/postgres";
}

HaCluster::Primary HaCluster::CurrentPrimary() const {
  try {
    pqxx::connection c(Url() + "?connect_timeout=1");
    pqxx::nontransaction tx(c);
    auto row = tx.exec1(
        "SELECT current_setting('data_directory'), pg_is_in_recovery(), inet_server_port()");
    if (row[1].as<bool>()) return {};
    int port = row[2].as<int>();
    return {row[0].as<std::string>(), port, "pg" + std::to_string(port - base_ - 9)};
  } catch (const std::exception&) {
    return {};
  }
}

bool HaCluster::Healthy() const {
  auto j = ClusterJson(base_);
  if (j.is_null()) return false;
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

std::map<std::string, long> HaCluster::Timelines() const {
  std::map<std::string, long> out;
  auto j = ClusterJson(base_);
  if (j.is_null()) return out;
  for (const auto& m : j["members"]) out[m.value("name", "")] = m.value("timeline", 0L);
  return out;
}

std::string HaCluster::Switchover(const std::string& leader) const {
  httplib::Client c("127.0.0.1", base_ + 20);
  c.set_connection_timeout(2);
  // Patroni answers once the new leader holds the key (it polls for up to 20 s).
  c.set_read_timeout(60);
  auto r = c.Post("/switchover", nlohmann::json{{"leader", leader}}.dump(), "application/json");
  return r ? std::to_string(r->status) + " " + r->body : "";
}

std::string HaCluster::MemberLog(const std::string& name) const {
  return test_support::SlurpFile(dir_ / "logs" / (name + ".log"));
}

pid_t HaCluster::PostmasterOf(const std::string& data_dir) {
  std::ifstream in(fs::path(data_dir) / "postmaster.pid");
  pid_t pid = 0;
  in >> pid;
  return pid;
}

pid_t HaCluster::EtcdPid(int n) const {
  return ProcessWithArgument("etcd", (dir_ / ("etcd" + std::to_string(n))).string());
}

std::vector<pid_t> HaCluster::ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    auto name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the
    // last ')'.
    std::string stat = test_support::SlurpFile(entry.path() / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(std::stoi(name));
  }
  return out;
}

pid_t HaCluster::PatroniOf(const std::string& data_dir) {
  // scripts/ha writes each member's patroni.yml beside its data folder.
  return ProcessWithArgument("patroni",
                             (fs::path(data_dir).parent_path() / "patroni.yml").string());
}

}  // namespace chaos
