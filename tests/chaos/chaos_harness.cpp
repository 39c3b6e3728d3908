#include "tests/chaos/chaos_harness.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <pqxx/pqxx>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "common/crypto.hpp"
#include "common/net.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "common/process.hpp"
#include "demo/stack.hpp"

namespace chaos {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Slurp(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out.size() > 4000 ? out.substr(out.size() - 4000) : out;
}

std::string ParentOf(const std::string& step_key, const std::string& suffix) {
  if (step_key.size() > suffix.size() &&
      step_key.compare(step_key.size() - suffix.size(), suffix.size(), suffix) == 0) {
    return step_key.substr(0, step_key.size() - suffix.size());
  }
  return "";
}

// $1: a private cluster's folder. Ends the postmaster named in its postmaster.pid (only if
// that process still serves this folder: a pid may have been reused), then removes the
// folder. SIGQUIT is PostgreSQL's immediate shutdown, as `pg_ctl stop -m immediate` sends it
// (no pg_ctl here: it would need the server's bindir and, as root, runuser); SIGKILL if the
// postmaster is still there after 10 s. Idempotent: nothing to do once the folder is gone.
constexpr const char* kStopLeftoverCluster = R"sh(
dir=$1
pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null)
serves() {
  [ -r "/proc/$pid/cmdline" ] && [ "$(cut -d ' ' -f 3 "/proc/$pid/stat" 2>/dev/null)" != Z ] &&
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir/data"
}
if [ -n "$pid" ] && serves; then
  kill -QUIT "$pid"
  i=0
  while serves && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  if serves; then kill -KILL "$pid"; fi
fi
rm -rf "$dir"
)sh";

// Who created a cluster folder: "<pid> <start time>", so that a reused pid is not mistaken
// for a live owner.
constexpr const char* kOwnerFile = "chaos-owner";

// A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or "" if
// there is no such process.
std::string StartTimeOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return "";
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
  }
  return field;
}

// Clusters of earlier runs whose owner died and whose watchdog did not finish (killed with
// it, or the machine stopped): stop them, so that they do not pile up.
void StopLeftoverClusters(const fs::path& temp_root) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(temp_root, ec)) {
    if (entry.path().filename().string().rfind("idemsaga-pg-", 0) != 0) continue;
    std::ifstream owner_file(entry.path() / kOwnerFile);
    pid_t pid = 0;
    std::string start_time;
    if (!(owner_file >> pid >> start_time)) continue;  // not a chaos harness's cluster
    if (StartTimeOf(pid) == start_time) continue;      // its owner is alive
    idemsaga::common::RunProgram(
        {"sh", "-c", kStopLeftoverCluster, "idemsaga-chaos-cleanup", entry.path().string()});
  }
}

}  // namespace

// Runs kStopLeftoverCluster on `dir` once this process has ended, however it ended.
// postgres is started by pg_ctl, so it is no child of ours and no parent-death signal reaches
// it; this watchdog waits for end-of-file on a pipe whose write end only we hold (O_CLOEXEC:
// no server we start inherits it), which the kernel closes when we exit or are killed.
// It runs in a session of its own (a Ctrl-C to the test's process group must not end it
// before it has cleaned up) and is reparented away from us by a double fork: CTest kills a
// timed-out test's whole process tree, and the watchdog has to outlive exactly that.
class ClusterWatchdog {
 public:
  explicit ClusterWatchdog(const fs::path& dir) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::string script = std::string("cat >/dev/null\n") + kStopLeftoverCluster;
    std::string dir_string = dir.string();
    std::vector<char*> argv = {
        const_cast<char*>("sh"), const_cast<char*>("-c"),
        script.data(),           const_cast<char*>("idemsaga-chaos-watchdog"),
        dir_string.data(),       nullptr};
    pid_t middle = fork();
    if (middle < 0) throw std::runtime_error("fork failed");
    if (middle == 0) {
      setsid();
      if (fork() != 0) _exit(0);
      dup2(fds[0], 0);  // the duplicate is inheritable; the originals close on exec
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        dup2(devnull, 1);
        dup2(devnull, 2);
      }
      close_range(3, ~0U, 0);
      execv("/bin/sh", argv.data());
      _exit(127);
    }
    close(fds[0]);
    waitpid(middle, nullptr, 0);
    write_end_ = fds[1];
  }
  ~ClusterWatchdog() { close(write_end_); }
  ClusterWatchdog(const ClusterWatchdog&) = delete;
  ClusterWatchdog& operator=(const ClusterWatchdog&) = delete;

 private:
  int write_end_ = -1;
};

namespace {

// The suite's one cluster; a scenario may crash and restart it.
WatchedCluster& Suite() {
  static WatchedCluster suite(/*durable=*/true);  // scenario 5 crashes it
  return suite;
}

}  // namespace

Process::Process(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
                 std::string log_path)
    : log_path_(std::move(log_path)) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string s = *e;
    std::string name = s.substr(0, s.find('='));
    // `env` replaces what it names (the first of two entries is the one getenv finds).
    if (name != "IDEMSAGA_CRASH_POINTS" && env.count(name) == 0) env_strings.push_back(s);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t harness = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Die with the harness: a server left behind holds ports and a cluster the next run needs.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != harness) _exit(127);  // it died before prctl took effect
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
}

Process::~Process() {
  if (!reaped_) Kill();
}

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void Process::Kill() {
  if (reaped_) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  reaped_ = true;
}

bool Process::Exited(std::chrono::milliseconds wait) {
  auto deadline = Clock::now() + wait;
  while (!reaped_) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      reaped_ = true;
      break;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

WatchedCluster::WatchedCluster(bool durable)
    : dir_(idemsaga::common::pg::PrivateCluster::MakeTempDir()) {
  StopLeftoverClusters(dir_.parent_path());
  std::ofstream(dir_ / kOwnerFile) << getpid() << " " << StartTimeOf(getpid()) << "\n";
  watchdog_ = std::make_unique<ClusterWatchdog>(dir_);
  cluster_ = idemsaga::common::pg::PrivateCluster::Start(
      {.dir = dir_, .durable = durable, .temporary = true});
}

// Members go in reverse: the cluster stops normally first, then the watchdog finds nothing
// left to do.
WatchedCluster::~WatchedCluster() {
  cluster_.reset();
  watchdog_.reset();
}

idemsaga::common::pg::PrivateCluster& Stack::Cluster() { return Suite().cluster(); }

const fs::path& Stack::ClusterDir() { return Suite().dir(); }

Stack::Stack(std::string name, StackOptions options) : name_(std::move(name)), options_(options) {
  dir_ = idemsaga::common::pg::PrivateCluster::MakeTempDir().string();
  for (const auto& kind : idemsaga::common::pg::DatabaseKinds()) {
    std::string db = "chaos_" + name_ + "_" + kind;
    {
      pqxx::connection admin(ServerUrl("postgres"));
      pqxx::nontransaction tx(admin);
      tx.exec("DROP DATABASE IF EXISTS " + tx.quote_name(db) + " WITH (FORCE)");
    }
    idemsaga::common::pg::CreateDatabaseIfMissing(ServerUrl("postgres"), db);
    pqxx::connection conn(ServerUrl(db));
    idemsaga::common::pg::Migrate(conn, kind);
  }
  pqxx::connection conn(DatabaseUrl("orchestrator"));
  pqxx::work tx(conn);
  for (const auto& [tenant, key] : {std::pair{"demo", "dev-key-demo"}, {"acme", "dev-key-acme"}}) {
    tx.exec_params("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ($1, $2)", tenant,
                   idemsaga::common::Sha256Hex(key));
  }
  tx.commit();
  for (const auto& which : kParticipants) ports_[which] = idemsaga::common::FreeLoopbackPort();
  for (int i = 0; i < options_.replicas; ++i)
    orchestrator_ports_.push_back(idemsaga::common::FreeLoopbackPort());
  orchestrators_.resize(options_.replicas);
}

Stack::~Stack() {
  for (auto& o : orchestrators_) o.reset();
  participants_.clear();
  CheckLogsForSanitizerReports();
  if (std::getenv("IDEMSAGA_CHAOS_KEEP") != nullptr || ::testing::Test::HasFailure()) {
    std::fprintf(stderr, "chaos: logs kept in %s\n", dir_.c_str());
  } else {
    std::filesystem::remove_all(dir_);
  }
}

void Stack::CheckLogsForSanitizerReports() {
  // What ASan, LSan, UBSan (with -fno-sanitize-recover) and TSan print first in a report.
  static const char* const kMarkers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                         "runtime error:", "WARNING: ThreadSanitizer"};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    std::ifstream in(entry.path());
    std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* marker : kMarkers) {
      auto at = log.find(marker);
      if (at != std::string::npos) {
        ADD_FAILURE() << "sanitizer report in " << entry.path().string() << ":\n"
                      << log.substr(at > 200 ? at - 200 : 0, 6000);
        break;
      }
    }
  }
}

std::string Stack::DatabaseUrl(const std::string& kind) const {
  return ServerUrl("chaos_" + name_ + "_" + kind);
}

std::string Stack::ServerUrl(const std::string& dbname) const {
  if (options_.server_url.empty()) return Cluster().Url(dbname);
  return idemsaga::common::pg::WithDatabase(options_.server_url, dbname);
}

int Stack::ServerPort() const {
  std::string url = ServerUrl("postgres");
  auto authority = url.find("://") + 3;
  auto end = url.find('/', authority);
  auto colon = url.rfind(':', end);
  return std::stoi(url.substr(colon + 1, end - colon - 1));
}

std::string Stack::OrchestratorUrl(int i) const {
  return "http://127.0.0.1:" + std::to_string(orchestrator_ports_[i]);
}

std::string Stack::ParticipantUrl(const std::string& which) const {
  return "http://127.0.0.1:" + std::to_string(ports_.at(which));
}

void Stack::WaitReady(const std::string& url, Process& p) {
  httplib::Client c(url);
  c.set_connection_timeout(0, 200000);
  c.set_read_timeout(1);
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    auto r = c.Get("/readyz");
    if (r && r->status == 200) return;
    if (p.Exited(std::chrono::milliseconds(0))) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error(url + " did not become ready; log:\n" + Slurp(p.log_path()));
}

std::unique_ptr<Process> Stack::StartParticipant(const std::string& which) {
  std::vector<std::string> argv = {IDEMSAGA_BINARY,  which,
                                   "--database-url", DatabaseUrl(which),
                                   "--listen",       "127.0.0.1:" + std::to_string(ports_[which])};
  argv.insert(argv.end(), options_.participant_args.begin(), options_.participant_args.end());
  auto p = std::make_unique<Process>(argv, std::map<std::string, std::string>{},
                                     dir_ + "/" + which + ".log");
  WaitReady(ParticipantUrl(which), *p);
  return p;
}

void Stack::StartParticipants() {
  for (const auto& which : kParticipants) participants_[which] = StartParticipant(which);
}

void Stack::RestartParticipant(const std::string& which) {
  auto& p = participants_.at(which);
  p->Kill();
  p = StartParticipant(which);
}

void Stack::StartOrchestrator(int i, const std::string& crash_points) {
  std::map<std::string, std::string> env;
  if (!crash_points.empty()) env["IDEMSAGA_CRASH_POINTS"] = crash_points;
  std::string database_url = DatabaseUrl("orchestrator");
  if (routes_.count(kDatabaseServer) != 0) {
    std::string port = std::to_string(ServerPort());
    database_url.replace(database_url.find(":" + port + "/"), port.size() + 1,
                         ":" + std::to_string(routes_.at(kDatabaseServer)));
  }
  std::vector<std::string> argv = {IDEMSAGA_BINARY,
                                   "orchestrator",
                                   "--database-url",
                                   database_url,
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(orchestrator_ports_[i]),
                                   "--lease-seconds",
                                   std::to_string(options_.lease_seconds),
                                   "--sweep-interval-ms",
                                   std::to_string(options_.sweep_interval_ms),
                                   "--participant-timeout-ms",
                                   std::to_string(options_.participant_timeout_ms),
                                   "--max-attempts",
                                   std::to_string(options_.max_attempts),
                                   "--stuck-retry-ms",
                                   "500"};
  // Every participant, always: an unset one defaults to a fixed local port that anything may
  // serve (another stack, perhaps), and ship_order is meant to be served only with shipping set.
  for (const auto& which : kParticipants) {
    argv.push_back("--participant");
    argv.push_back(which + "=" +
                   (routes_.count(which) != 0
                        ? "http://127.0.0.1:" + std::to_string(routes_.at(which))
                        : ParticipantUrl(which)));
  }
  argv.insert(argv.end(), options_.orchestrator_args.begin(), options_.orchestrator_args.end());
  orchestrators_[i] =
      std::make_unique<Process>(argv, env, dir_ + "/orchestrator-" + std::to_string(i) + ".log");
  WaitReady(OrchestratorUrl(i), *orchestrators_[i]);
}

void Stack::KillOrchestrator(int i) { orchestrators_[i]->Kill(); }

void Stack::SetFaults(const std::string& which, const nlohmann::json& faults) {
  httplib::Client c(ParticipantUrl(which));
  auto r = c.Put("/admin/faults",
                 {{"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}},
                 faults.dump(), "application/json");
  if (!r || r->status != 200) throw std::runtime_error("could not set faults on " + which);
}

std::string OrderBody(int i, bool declined) {
  nlohmann::json body = {{"customer_id", "cust_" + std::to_string(i)},
                         {"items", {{{"sku", "widget"}, {"quantity", 1 + i % 3}}}},
                         {"amount_cents", 1000 + i},
                         {"currency", "USD"},
                         {"payment_method", declined ? "pm_card_declined" : "pm_card_visa"}};
  return body.dump();
}

std::string ShipOrderBody(int i, bool declined, bool unserviceable) {
  auto body = nlohmann::json::parse(OrderBody(i, declined));
  body["address"] = {{"name", "Customer " + std::to_string(i)},
                     {"line1", std::to_string(1 + i) + " Rue du Test"},
                     {"city", "Paris"},
                     {"postal_code", "75001"},
                     {"country", unserviceable ? "AQ" : "FR"}};
  return body.dump();
}

std::string DeliverOrderBody(int i, bool declined, bool unserviceable) {
  auto ship = nlohmann::json::parse(ShipOrderBody(i, declined, unserviceable));
  nlohmann::json address = ship["address"];
  ship.erase("address");
  return nlohmann::json{{"order", ship}, {"address", address}}.dump();
}

void Driver::SetUrls(std::vector<std::string> urls) {
  std::lock_guard lock(mutex_);
  urls_ = std::move(urls);
}

bool Driver::Attempt(KeyRecord& r, int replica_hint) {
  std::string url;
  {
    std::lock_guard lock(mutex_);
    url = urls_[static_cast<size_t>(replica_hint) % urls_.size()];
  }
  httplib::Client c(url);
  c.set_connection_timeout(1);
  c.set_read_timeout(std::chrono::milliseconds(read_timeout_ms_));
  // Both routes answer a finished saga with its stored response (a 202 while it runs).
  const std::string path = r.saga == kPlaceOrder ? "/v1/orders" : "/v1/runs/" + r.saga;
  History* history = history_;
  long long op = history != nullptr ? history->Invoke(r.tenant, r.key, r.body) : 0;
  auto res =
      c.Post(path, {{"Authorization", "Bearer dev-key-" + r.tenant}, {"Idempotency-Key", r.key}},
             r.body, "application/json");
  int status = res ? res->status : 0;
  ++r.statuses[status];
  if (history != nullptr) {
    if (res) {
      history->Complete(op, status, res->body);
    } else {
      history->Info(op, httplib::to_string(res.error()));
    }
  }
  if (!res) return false;
  if (status / 100 == 2 && status != 202) r.acks.push_back(res->body);
  if (!SagaOutcome(res->body).empty()) {
    r.final = true;
    r.final_status = status;
    r.final_body = res->body;
    return true;
  }
  return false;
}

void Driver::UntilFinal(KeyRecord& r, Clock::time_point deadline, int replica_hint) {
  for (int attempt = 0; Clock::now() < deadline; ++attempt) {
    if (Attempt(r, replica_hint + attempt)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Settle(Driver& driver, std::vector<KeyRecord>& records, std::chrono::seconds within,
            int threads) {
  auto deadline = Clock::now() + within;
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (size_t i; (i = next++) < records.size();) {
        if (!records[i].final) driver.UntilFinal(records[i], deadline, t);
      }
    });
  }
  for (auto& t : ts) t.join();
}

std::string Report::Line(const std::string& scenario, const std::string& extra) const {
  std::string s = scenario + ":" +
                  Counts({{"orders", orders},
                          {"terminal", terminal},
                          {"double_charges", double_charges},
                          {"double_reservations", double_reservations},
                          {"double_shipments", double_shipments},
                          {"orphan_reservations", orphan_reservations},
                          {"orphan_charges", orphan_charges},
                          {"orphan_shipments", orphan_shipments},
                          {"completed_mismatch", completed_mismatch},
                          {"failed_leftover", failed_leftover},
                          {"lost_acks", lost_acks},
                          {"replay_mismatch", replay_mismatch}}) +
                  " reconcile_discrepancies=" + std::to_string(reconcile_discrepancies) + "/" +
                  std::to_string(reconcile_sagas) + "_sagas";
  return extra.empty() ? s : s + " " + extra;
}

bool Report::Clean() const {
  return terminal == orders && double_charges == 0 && double_reservations == 0 &&
         double_shipments == 0 && orphan_reservations == 0 && orphan_charges == 0 &&
         orphan_shipments == 0 && completed_mismatch == 0 && failed_leftover == 0 &&
         lost_acks == 0 && replay_mismatch == 0 && reconcile_discrepancies == 0;
}

namespace {

// I7: runs `idemsaga reconcile` over the stack as an operator would.
void Reconcile(const Stack& stack, Report& rep) {
  std::string out = ::testing::TempDir() + "reconcile-" + idemsaga::common::RandomHex(6) + ".json";
  std::vector<std::string> argv = {
      IDEMSAGA_BINARY, "reconcile", "--database-url", stack.DatabaseUrl("orchestrator"),
      "--since",       "2h",        "--format",       "json"};
  for (const auto& p : kParticipants) {
    argv.insert(argv.end(), {"--participant", p + "=" + stack.ParticipantUrl(p)});
  }
  int rc = idemsaga::common::RunProgram(argv, out);
  rep.reconcile_report = Slurp(out);
  std::remove(out.c_str());
  auto j = nlohmann::json::parse(rep.reconcile_report, nullptr, false);
  if (rc < 0 || j.is_discarded() || !j.contains("discrepancies")) {
    rep.reconcile_discrepancies = -1;
    return;
  }
  rep.reconcile_discrepancies =
      j.value("discrepancies_found", static_cast<long long>(j["discrepancies"].size())) +
      static_cast<long long>(j["errors"].size());
  rep.reconcile_sagas = j.value("sagas_checked", 0LL);
}

}  // namespace

Report CheckInvariants(const Stack& stack, const std::vector<KeyRecord>& records) {
  using Id = std::pair<std::string, std::string>;  // tenant, parent key
  std::map<Id, std::string> status, saga, stored_body;
  {
    pqxx::connection c(stack.DatabaseUrl("orchestrator"));
    pqxx::read_transaction tx(c);
    for (const auto& row : tx.exec("SELECT tenant_id, idempotency_key, status, saga_name, "
                                   "coalesce(response_body, '') FROM idempotency_keys")) {
      Id id{row[0].as<std::string>(), row[1].as<std::string>()};
      status[id] = row[2].as<std::string>();
      saga[id] = row[3].as<std::string>();
      stored_body[id] = row[4].as<std::string>();
    }
  }
  // The saga an effect belongs to: its own parent, or the parent of the child it ran under.
  auto owner = [&](const std::string& tenant, const std::string& key) -> Id {
    Id id{tenant, key};
    const std::string child = "-order";
    if (status.count(id) == 0 && key.size() > child.size() && key.ends_with(child)) {
      Id parent{tenant, key.substr(0, key.size() - child.size())};
      if (saga[parent] == kDeliverOrder) return parent;
    }
    return id;
  };
  auto ships = [&](const Id& id) { return saga[id] == kShipOrder || saga[id] == kDeliverOrder; };
  // Net effects per parent: reservations still held, charges still captured or authorised (a
  // 3-D Secure charge not yet captured holds the customer's money too), shipments not
  // cancelled, and all rows.
  std::map<Id, int> held, captured, authorised, shipped, reservation_rows, charge_rows,
      shipment_rows;
  std::map<Id, std::string> held_id, shipped_reservation;  // which reservation each holds
  {
    pqxx::connection c(stack.DatabaseUrl("inventory"));
    pqxx::read_transaction tx(c);
    for (const auto& row :
         tx.exec("SELECT tenant_id, idempotency_key, status, reservation_id FROM reservations")) {
      Id id = owner(row[0].as<std::string>(), ParentOf(row[1].as<std::string>(), "-inventory"));
      ++reservation_rows[id];
      if (row[2].as<std::string>() == "reserved") {
        ++held[id];
        held_id[id] = row[3].as<std::string>();
      }
    }
  }
  {
    pqxx::connection c(stack.DatabaseUrl("payment"));
    pqxx::read_transaction tx(c);
    for (const auto& row : tx.exec("SELECT tenant_id, idempotency_key, status FROM charges")) {
      Id id = owner(row[0].as<std::string>(), ParentOf(row[1].as<std::string>(), "-payment"));
      ++charge_rows[id];
      if (row[2].as<std::string>() == "captured") ++captured[id];
      if (row[2].as<std::string>() == "requires_action") ++authorised[id];
    }
  }
  {
    pqxx::connection c(stack.DatabaseUrl("shipping"));
    pqxx::read_transaction tx(c);
    for (const auto& row :
         tx.exec("SELECT tenant_id, idempotency_key, status, reservation_id FROM shipments")) {
      Id id = owner(row[0].as<std::string>(), ParentOf(row[1].as<std::string>(), "-shipping"));
      ++shipment_rows[id];
      if (row[2].as<std::string>() == "created") {
        ++shipped[id];
        shipped_reservation[id] = row[3].as<std::string>();
      }
    }
  }
  Report rep;
  rep.orders = static_cast<long long>(records.size());
  for (const auto& [id, n] : charge_rows) rep.double_charges += n > 1 ? 1 : 0;
  for (const auto& [id, n] : reservation_rows) rep.double_reservations += n > 1 ? 1 : 0;
  for (const auto& [id, n] : shipment_rows) rep.double_shipments += n > 1 ? 1 : 0;
  // I6: every net effect has a parent that accounts for it (a completed saga; for a shipment,
  // a completed ship_order).
  for (const auto& [id, n] : held) {
    if (n > 0 && status[id] != "completed") ++rep.orphan_reservations;
  }
  for (const auto& [id, n] : captured) {
    if (n > 0 && status[id] != "completed") ++rep.orphan_charges;
  }
  for (const auto& [id, n] : authorised) {
    if (n > 0 && status[id] != "completed") ++rep.orphan_charges;
  }
  for (const auto& [id, n] : shipped) {
    if (n > 0 && (status[id] != "completed" || !ships(id))) ++rep.orphan_shipments;
  }
  for (const auto& [id, st] : status) {
    bool shipping = ships(id);
    if (st == "completed" && (held[id] != 1 || captured[id] != 1 || authorised[id] != 0 ||
                              shipped[id] != (shipping ? 1 : 0) ||
                              (shipping && shipped_reservation[id] != held_id[id]))) {
      ++rep.completed_mismatch;
    }
    if (st == "failed" &&
        (held[id] != 0 || captured[id] != 0 || authorised[id] != 0 || shipped[id] != 0)) {
      ++rep.failed_leftover;
    }
  }
  for (const auto& r : records) {
    Id id{r.tenant, r.key};
    std::string st = status.count(id) ? status[id] : "";
    if (r.final && (st == "completed" || st == "failed")) ++rep.terminal;
    // I4: every 2xx ever acknowledged is the completed saga's stored response, byte for byte.
    for (const auto& ack : r.acks) {
      if (st != "completed")
        ++rep.lost_acks;
      else if (ack != stored_body[id])
        ++rep.replay_mismatch;
    }
    if (r.final && r.final_body != stored_body[id]) ++rep.replay_mismatch;
  }
  Reconcile(stack, rep);
  return rep;
}

std::map<KeyId, KeyState> KeyStates(const Stack& stack) {
  std::map<KeyId, KeyState> states;
  {
    pqxx::connection c(stack.DatabaseUrl("orchestrator"));
    pqxx::read_transaction tx(c);
    for (const auto& row : tx.exec("SELECT tenant_id, idempotency_key, status, "
                                   "coalesce(response_status, 0), coalesce(response_body, '') "
                                   "FROM idempotency_keys")) {
      KeyState& s = states[{row[0].as<std::string>(), row[1].as<std::string>()}];
      s.status = row[2].as<std::string>();
      s.stored_status = row[3].as<int>();
      s.stored_body = row[4].as<std::string>();
    }
  }
  // Hands `count` each row of `sql` (tenant, step key, status) with its parent key's state.
  auto each_effect = [&](const std::string& kind, const char* sql, const std::string& suffix,
                         auto count) {
    pqxx::connection c(stack.DatabaseUrl(kind));
    pqxx::read_transaction tx(c);
    for (const auto& row : tx.exec(sql)) {
      count(states[{row[0].as<std::string>(), ParentOf(row[1].as<std::string>(), suffix)}],
            row[2].as<std::string>());
    }
  };
  each_effect("inventory", "SELECT tenant_id, idempotency_key, status FROM reservations",
              "-inventory", [](KeyState& s, const std::string& status) {
                ++s.reservation_rows;
                s.reservations_held += status == "reserved" ? 1 : 0;
              });
  each_effect("payment", "SELECT tenant_id, idempotency_key, status FROM charges", "-payment",
              [](KeyState& s, const std::string& status) {
                ++s.charge_rows;
                // A 3-D Secure charge not yet captured holds the customer's money too.
                s.charges_in_force += status != "refunded" ? 1 : 0;
              });
  return states;
}

}  // namespace chaos
