// A private PostgreSQL 15 cluster: initdb into a folder of ours, pg_ctl start on loopback.
//
// Used by the test suite (a temporary cluster per run) and by `idemsaga dev` (a cluster kept
// under .idemsaga/). initdb and postgres refuse to run as root, so as root every server
// command runs as the `postgres` system user, which then owns the folder.
// Not thread-safe; one owner starts and stops it.
//   auto cluster = PrivateCluster::Start({.dir = TempDir(), .durable = false, .temporary = true});
//   pqxx::connection c(cluster->Url("postgres"));
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace common::pg {

class PrivateCluster {
 public:
  struct Options {
    std::filesystem::path dir;  // holds data/ and server.log; created when missing
    int port = 0;               // 0 picks a free loopback port
    bool durable = true;        // false turns fsync off: fine for throwaway test clusters
    bool temporary = false;     // remove `dir` on Stop()
  };

  // initdb when `dir` holds no cluster yet, then starts the server and waits until it accepts
  // connections. A server left running on the same folder (a killed `idemsaga dev`) is stopped
  // first. Throws std::runtime_error with the server log's path on failure.
  static std::unique_ptr<PrivateCluster> Start(Options options);

  // A fresh temporary folder for a throwaway cluster (under $TMPDIR or /tmp).
  static std::filesystem::path MakeTempDir();

  // `preferred` if the server's user can reach it, else a folder under /var/lib/idemsaga
  // (as root, a checkout under /root is not reachable by `postgres`).
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
  // Fast shutdown of a detached cluster in `dir`, removing `dir` when `remove` is set.
  static void StopDetached(const std::filesystem::path& dir, bool remove);

  std::string Url(std::string_view dbname = "postgres") const;
  
  

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

}  // namespace common::pg
