#include "common/pg/cluster.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "common/crypto.hpp"
#include "common/net.hpp"
#include "common/process.hpp"

namespace idemsaga::common::pg {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kServerUser = "postgres";

bool IsRoot() { return geteuid() == 0; }

// Server commands: as root they run as `postgres` (initdb and postgres refuse root), from /:
// in a working directory closed to that user (a checkout under /root) each of them would
// first complain that it cannot go back there, a misleading line in a failure's log.
// Callers pass absolute paths.
std::vector<std::string> AsServerUser(std::vector<std::string> argv) {
  if (!IsRoot()) return argv;
  std::vector<std::string> out = {"runuser", "-u", std::string(kServerUser), "--"};
  out.insert(out.end(), {"env", "--chdir=/"});
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

void GiveToServerUser(const fs::path& path) {
  if (!IsRoot()) return;
  struct passwd* pw = getpwnam(std::string(kServerUser).c_str());
  if (pw == nullptr) {
    throw std::runtime_error("running as root needs the 'postgres' system user to own the cluster");
  }
  if (chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
    throw std::runtime_error("cannot chown " + path.string());
  }
}

std::string FindBindir() {
  std::vector<std::string> candidates;
  try {
    candidates.push_back(ReadProgramOutput({"pg_config", "--bindir"}));
  } catch (const std::exception&) {
  }
  candidates.emplace_back("/usr/lib/postgresql/15/bin");
  for (const auto& dir : candidates) {
    if (fs::exists(fs::path(dir) / "initdb") && fs::exists(fs::path(dir) / "pg_ctl")) return dir;
  }
  throw std::runtime_error(
      "PostgreSQL 15 server binaries not found (pg_config --bindir, /usr/lib/postgresql/15/bin); "
      "install postgresql-15");
}

// The last lines of a log, for an error message: whoever reads the message may find the
// folder gone (a temporary cluster, the CTest fixture's cleanup), so the lines travel with it.
std::string LogTail(const fs::path& path, size_t max_lines = 20) {
  std::ifstream in(path);
  if (!in) return "  (" + path.filename().string() + ": no log was written)\n";
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > max_lines) lines.pop_front();
  }
  std::string out = "  --- last lines of " + path.filename().string() + " ---\n";
  for (const auto& line : lines) out += "  " + line + "\n";
  return out;
}

}  // namespace

fs::path PrivateCluster::MakeTempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/idemsaga-pg-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  return tmpl;
}

fs::path PrivateCluster::ReachableDir(const fs::path& preferred) {
  if (!IsRoot()) return preferred;
  fs::path parent = fs::absolute(preferred).parent_path();
  fs::create_directories(parent);
  if (RunProgram(AsServerUser({"test", "-x", parent.string()})) == 0) return preferred;
  return fs::path("/var/lib/idemsaga") / Sha256Hex(fs::absolute(preferred).string()).substr(0, 16);
}

std::unique_ptr<PrivateCluster> PrivateCluster::Start(Options options) {
  options.dir = ReachableDir(fs::absolute(options.dir));
  std::unique_ptr<PrivateCluster> cluster(new PrivateCluster(std::move(options)));
  cluster->bindir_ = FindBindir();
  cluster->InitIfNeeded();
  cluster->StartServer();
  return cluster;
}

PrivateCluster::~PrivateCluster() {
  try {
    Stop();
  } catch (...) {
  }
}

int PrivateCluster::PgCtl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bindir_ + "/pg_ctl", "-D", (options_.dir / "data").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(AsServerUser(argv), (options_.dir / "pg_ctl.log").string());
}

void PrivateCluster::InitIfNeeded() {
  fs::create_directories(options_.dir);
  fs::permissions(options_.dir, fs::perms::owner_all, fs::perm_options::replace);
  GiveToServerUser(options_.dir);
  if (fs::exists(options_.dir / "data" / "PG_VERSION")) return;
  // trust on loopback only: a private, throwaway cluster reachable from this machine alone.
  int rc = RunProgram(
      AsServerUser({bindir_ + "/initdb", "-D", (options_.dir / "data").string(), "-U", "postgres",
                    "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"}),
      (options_.dir / "initdb.log").string());
  if (rc != 0) {
    throw std::runtime_error("initdb failed (exit " + std::to_string(rc) + ") in " +
                             options_.dir.string() + "\n" + LogTail(options_.dir / "initdb.log"));
  }
  std::ofstream conf(options_.dir / "data" / "postgresql.conf", std::ios::app);
  conf << "\ninclude_if_exists = 'idemsaga.conf'\n";
}

void PrivateCluster::WriteSettings() {
  fs::path path = options_.dir / "data" / "idemsaga.conf";
  std::ofstream conf(path, std::ios::trunc);
  conf << "# Written by idemsaga on every start.\n"
       << "port = " << port_ << "\n"
       << "listen_addresses = '127.0.0.1'\n"
       << "unix_socket_directories = ''\n"
       << "max_connections = 300\n"
       << "shared_buffers = '128MB'\n"
       << "fsync = " << (options_.durable ? "on" : "off") << "\n"
       << "full_page_writes = " << (options_.durable ? "on" : "off") << "\n"
       << "logging_collector = off\n";
  conf.close();
  GiveToServerUser(path);
}

void PrivateCluster::StartServer() {
  // A server left running on this folder (its owner was killed) holds the port and data.
  if (PgCtl({"status"}) == 0 && PgCtl({"stop", "-m", "fast", "-w"}) != 0) {
    PgCtl({"stop", "-m", "immediate", "-w"});
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = options_.port != 0 ? options_.port : common::FreeLoopbackPort();
    WriteSettings();
    if (PgCtl({"start", "-w", "-t", "60", "-l", (options_.dir / "server.log").string()}) == 0) {
      running_ = true;
      return;
    }
    if (options_.port != 0) break;  // a fixed port will not get better by retrying
  }
  throw std::runtime_error("PostgreSQL did not start on port " + std::to_string(port_) + " in " +
                           options_.dir.string() + "\n" + LogTail(options_.dir / "server.log") +
                           LogTail(options_.dir / "pg_ctl.log", 5));
}

void PrivateCluster::Stop() {
  if (running_) {
    // A fast stop waits for the shutdown checkpoint, which can outlast pg_ctl's minute after
    // gigabytes of writes; the server must not outlive us (nor a folder removed under it, its
    // files still held open), and what it committed is in the WAL, so then it stops at once.
    if (PgCtl({"stop", "-m", "fast", "-w"}) != 0) PgCtl({"stop", "-m", "immediate", "-w"});
    running_ = false;
  }
  if (options_.temporary && fs::exists(options_.dir)) fs::remove_all(options_.dir);
}

void PrivateCluster::Crash() {
  PgCtl({"stop", "-m", "immediate", "-w"});
  running_ = false;
}

void PrivateCluster::Restart() {
  if (PgCtl({"start", "-w", "-t", "60", "-l", (options_.dir / "server.log").string()}) != 0) {
    throw std::runtime_error("PostgreSQL did not restart on port " + std::to_string(port_) + "\n" +
                             LogTail(options_.dir / "server.log") +
                             LogTail(options_.dir / "pg_ctl.log", 5));
  }
  running_ = true;
}

void PrivateCluster::StopDetached(const fs::path& dir, bool remove) {
  PrivateCluster cluster({.dir = ReachableDir(fs::absolute(dir)), .temporary = remove});
  cluster.bindir_ = FindBindir();
  cluster.running_ = fs::exists(cluster.options_.dir / "data" / "postmaster.pid");
  cluster.Stop();
}

bool PrivateCluster::ServerRunning() const {
  // The server removes the file when it stops. Anything this cannot read is taken as running:
  // a wrong "stopped" would end a healthy stack.
  const auto path = options_.dir / "data" / "postmaster.pid";
  std::error_code ec;
  bool exists = fs::exists(path, ec);
  if (ec) return true;
  if (!exists) return false;
  std::ifstream pid_file(path);
  pid_t pid = 0;
  if (!(pid_file >> pid) || pid <= 0) return true;
  // EPERM: alive, and another user's (the server runs as `postgres` when we are root).
  return kill(pid, 0) == 0 || errno == EPERM;
}

std::string PrivateCluster::Url(std::string_view dbname) const {
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/" + std::string(dbname);
}

}  // namespace idemsaga::common::pg
