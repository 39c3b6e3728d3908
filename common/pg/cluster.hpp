// A private PostgreSQL 15 cluster: initdb into a folder of ours, pg_ctl start on loopback.
//
// Used by the test suite (a temporary cluster per run) and by `idemsaga dev` (a cluster kept
// under .idemsaga/). initdb and postgres refuse to run as root, so as root every server
// command runs as the `postgres` system user, which then owns the folder; when that user
// cannot reach the folder (a checkout under /root), the cluster lives under
// /var/lib/idemsaga instead (ReachableDir), for every caller alike.
// Not thread-safe; one owner starts and stops it.
//   auto cluster = PrivateCluster::Start({.dir = TempDir(), .durable = false, .temporary = true});
//   pqxx::connection c(cluster->Url("postgres"));
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace idemsaga::common::pg {

class PrivateCluster {
 public:
  struct Options {
    // Holds data/ and the logs; created when missing. Moved to ReachableDir(dir) when the
    // server's user cannot reach it: dir() says where the cluster really is.
    std::filesystem::path dir;
    int port = 0;            // 0 picks a free loopback port
    bool durable = true;     // false turns fsync off: fine for throwaway test clusters
    bool temporary = false;  // remove `dir` on Stop()
  };

  // initdb when `dir` holds no cluster yet, then starts the server and waits until it accepts
  // connections. A server left running on the same folder (a killed `idemsaga dev`) is stopped
  // first. On failure throws std::runtime_error carrying the last lines of initdb's or the
  // server's log (a temporary folder is gone by the time anyone could read it).
  static std::unique_ptr<PrivateCluster> Start(Options options);

  // A fresh temporary folder for a throwaway cluster (under $TMPDIR or /tmp).
  static std::filesystem::path MakeTempDir();

  // `preferred` if the server's user can reach it, else a folder under /var/lib/idemsaga
  // named after it (as root, a checkout under /root is not reachable by `postgres`). The same
  // `preferred` always gives the same folder, so a later StopDetached() finds the cluster.
  static std::filesystem::path ReachableDir(const std::filesystem::path& preferred);

  ~PrivateCluster();
  PrivateCluster(const PrivateCluster&) = delete;
  PrivateCluster& operator=(const PrivateCluster&) = delete;

  // Fast shutdown (idempotent). Removes the folder of a temporary cluster.
  void Stop();
  // Immediate shutdown, as after a crash: no checkpoint, recovery on the next Restart().
  void Crash();
  // Starts again on the same port after Stop() or Crash().
  void Restart();

  // Leaves the server running past this object (a CTest fixture's setup step);
  // StopDetached() ends it later.
  void Detach() {
    running_ = false;
    options_.temporary = false;
  }
  // Fast shutdown of a detached cluster started with `dir` (wherever ReachableDir put it),
  // removing its folder when `remove` is set.
  static void StopDetached(const std::filesystem::path& dir, bool remove);

  std::string Url(std::string_view dbname = "postgres") const;
  // Whether the server this object started is still running (its postmaster.pid names a live
  // process): false once it was stopped behind our back (a Ctrl-C that reached only it).
  bool ServerRunning() const;
  // Where the cluster lives: Options::dir, or the folder ReachableDir chose instead.
  const std::filesystem::path& dir() const { return options_.dir; }

 private:
  explicit PrivateCluster(Options options) : options_(std::move(options)) {}
  void InitIfNeeded();
  void WriteSettings();
  void StartServer();
  int PgCtl(const std::vector<std::string>& args);

  Options options_;
  std::string bindir_;
  int port_ = 0;
  bool running_ = false;
};

}  // namespace idemsaga::common::pg
