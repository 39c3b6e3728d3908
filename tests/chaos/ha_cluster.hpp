// PostgreSQL under Patroni for the failover scenarios: `scripts/ha --db-only` (three etcd
// members, a primary and two replicas with synchronous replication, HAProxy in front) on ports
// from a base of the test's, in a temporary folder of its own, and the faults the scenarios
// inject into it (a crash, a pause, a planned switchover, the loss of etcd's quorum).
//
// Everything it starts is the script's, stopped by the script (SIGTERM on destruction), or by
// the parent-death signals the script gives its children should the test die first. A fault
// signals only processes of this cluster, found by their data folders. Not thread-safe; the
// read-only queries (Primary, Healthy) may run beside the test's order load.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/chaos/chaos_harness.hpp"

namespace chaos {

class HaCluster {
 public:
  // Starts the script and waits for its "ha ready" (std::runtime_error with its log if not).
  explicit HaCluster(int base_port);
  ~HaCluster();
  HaCluster(const HaCluster&) = delete;
  HaCluster& operator=(const HaCluster&) = delete;

  // HAProxy's URL: always the primary, whichever member that is.
  std::string Url() const;
  // One member's own URL (its PostgreSQL port), bypassing HAProxy.
  std::string MemberUrl(int port) const;

  struct Primary {
    std::string data_dir;  // "" while there is none
    int port = 0;          // the member's own PostgreSQL port
    std::string name;      // Patroni's name for it (pg1..pg3)
  };
  // The member HAProxy reaches now, if it accepts writes.
  Primary CurrentPrimary() const;
  // Whether every member runs, one leads and one is its synchronous standby (so that the
  // next fault loses no acknowledged commit), by Patroni's REST /cluster.
  bool Healthy() const;
  // Every member's timeline by its name, as /cluster reports it (0 for one that reports none).
  std::map<std::string, long> Timelines() const;

  // A planned switchover away from `leader` through Patroni's REST POST /switchover; Patroni
  // picks the synchronous standby. Returns Patroni's answer ("" on no answer).
  std::string Switchover(const std::string& leader) const;
  // The postmaster of the member with this data folder (the first line of postmaster.pid).
  static pid_t PostmasterOf(const std::string& data_dir);
  // A process's children (a postmaster's: its backends, checkpointer, WAL senders, each of
  // which PostgreSQL puts in a process group of its own).
  static std::vector<pid_t> ChildrenOf(pid_t parent);
  // The Patroni that runs the member with this data folder; -1 if none runs.
  static pid_t PatroniOf(const std::string& data_dir);
  // The etcd member `n` (1..3) of this cluster, by its data folder; -1 if none runs.
  pid_t EtcdPid(int n) const;

  // What member `name` (pg1..pg3) logged so far: its Patroni's and its PostgreSQL's lines.
  std::string MemberLog(const std::string& name) const;

  // Set when a scenario failed: the destructor then keeps the folder and its logs.
  void KeepLogs() { keep_ = true; }

 private:
  int base_;
  std::filesystem::path dir_;
  std::unique_ptr<Process> script_;
  bool keep_ = false;
};

}  // namespace chaos
