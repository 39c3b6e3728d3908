// The fault suite's harness: real `idemsaga` processes (orchestrator replicas, inventory,
// payment, shipping) on loopback ports, a private PostgreSQL cluster of its own (so that it
// can be crashed), clients that retry with the same key until they get a final answer, and
// the invariant checker over the four databases.
//
// Nothing it starts outlives it, however the test ends (an assertion, abort, a sanitizer
// report, SIGKILL from a CTest timeout): each server gets a parent-death signal, and a
// watchdog outside the test's process tree stops the private cluster (pg_ctl's postgres is
// no child of ours) once the test process is gone. A leftover cluster of an earlier run whose
// owner and watchdog both died is stopped by the next run. A sanitizer report in a server's
// log fails the test.
//
// Not thread-safe except Driver, whose Attempt() may be called from many threads.
#pragma once

#include <httplib.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/pg/cluster.hpp"
#include "tests/chaos/history.hpp"

namespace chaos {

// A child process; SIGKILLed on destruction if still running, and when the thread that
// created it ends (PR_SET_PDEATHSIG): create it on the test's own thread. Ends only what it
// started.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::map<std::string, std::string>& env,
          std::string log_path);
  ~Process();
  void Signal(int sig);
  void Kill();                                  // SIGKILL and reap
  bool Exited(std::chrono::milliseconds wait);  // reaps when it has exited
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

class ClusterWatchdog;

// A private PostgreSQL cluster of a test's own that is stopped when the test's process ends,
// however it ends (a watchdog outside the process tree; see the top of this file). The
// suite's cluster is one; a scenario with several clusters starts more.
class WatchedCluster {
 public:
  explicit WatchedCluster(bool durable);
  ~WatchedCluster();
  WatchedCluster(const WatchedCluster&) = delete;
  WatchedCluster& operator=(const WatchedCluster&) = delete;
  idemsaga::common::pg::PrivateCluster& cluster() { return *cluster_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<ClusterWatchdog> watchdog_;
  std::unique_ptr<idemsaga::common::pg::PrivateCluster> cluster_;
};

struct StackOptions {
  int replicas = 1;
  int lease_seconds = 2;
  int sweep_interval_ms = 200;
  int participant_timeout_ms = 2000;
  int max_attempts = 6;
  std::vector<std::string> orchestrator_args;  // added to every orchestrator's command line
  std::vector<std::string> participant_args;   // added to every participant's command line
  // postgresql:// URL of the server the stack's databases live on (HAProxy's, for the
  // failover scenarios); "" is the suite's private cluster.
  std::string server_url;
};

// The participants every stack runs, and every orchestrator is given (ship_order needs all
// three).
inline const std::vector<std::string> kParticipants = {"inventory", "payment", "shipping"};

class Stack {
 public:
  // Fresh databases named after `name` on the suite's cluster, migrated, tenants seeded.
  Stack(std::string name, StackOptions options = {});
  ~Stack();

  void StartParticipants();
  void StartOrchestrator(int i, const std::string& crash_points = "");
  void KillOrchestrator(int i);
  Process& orchestrator(int i) { return *orchestrators_[i]; }
  // `which`: one of kParticipants (std::out_of_range otherwise).
  Process& participant(const std::string& which) { return *participants_.at(which); }
  void RestartParticipant(const std::string& which);  // SIGKILL, then start again
  std::string OrchestratorUrl(int i) const;
  std::string ParticipantUrl(const std::string& which) const;
  int ParticipantPort(const std::string& which) const { return ports_.at(which); }
  // The port of the server the databases live on (one host:port URL).
  int ServerPort() const;
  // Orchestrators started from now on reach `what` (one of kParticipants, or kDatabaseServer)
  // at 127.0.0.1:`port` instead (a Forwarder's, to cut that one hop); everything else,
  // participants included, keeps reaching it directly.
  void RouteOrchestrator(const std::string& what, int port) { routes_[what] = port; }
  void SetFaults(const std::string& which, const nlohmann::json& faults);

  std::string DatabaseUrl(const std::string& kind) const;
  // The server's URL with `dbname` (StackOptions::server_url, or the suite's cluster).
  std::string ServerUrl(const std::string& dbname) const;
  const std::string& log_dir() const { return dir_; }
  static idemsaga::common::pg::PrivateCluster& Cluster();
  static const std::filesystem::path& ClusterDir();

 private:
  void WaitReady(const std::string& url, Process& p);
  // Fails the running test for every sanitizer report in a server's log.
  void CheckLogsForSanitizerReports();
  std::unique_ptr<Process> StartParticipant(const std::string& which);

  std::string name_;
  StackOptions options_;
  std::string dir_;
  std::map<std::string, int> ports_;
  std::vector<int> orchestrator_ports_;
  std::map<std::string, int> routes_;
  std::vector<std::unique_ptr<Process>> orchestrators_;
  std::map<std::string, std::unique_ptr<Process>> participants_;
};

// Stack::RouteOrchestrator's name for the orchestrator's database server.
inline constexpr const char* kDatabaseServer = "postgresql";

inline constexpr const char* kPlaceOrder = "place_order";
inline constexpr const char* kShipOrder = "ship_order";
// place_order with its two steps side by side: the same effects as place_order.
inline constexpr const char* kPlaceOrderParallel = "place_order_parallel";
// place_order as a child saga (its keys "<key>-order-<step>"), then shipping: the same
// effects as ship_order.
inline constexpr const char* kDeliverOrder = "deliver_order";

// What a client saw for one key.
struct KeyRecord {
  std::string tenant;
  std::string key;
  std::string body;
  std::string saga = kPlaceOrder;  // place_order: POST /v1/orders; others: /v1/runs/<saga>
  bool final = false;
  int final_status = 0;
  std::string final_body;
  std::vector<std::string> acks;  // every 2xx body it was ever sent (202 excluded)
  std::map<int, int> statuses;    // every status seen (0: no answer)
};

// Submits sagas and retries each with the same key until its answer is final (a stored
// response: a body whose "status" is "completed" or "failed", the same on both routes).
class Driver {
 public:
  explicit Driver(std::vector<std::string> urls) : urls_(std::move(urls)) {}
  void SetUrls(std::vector<std::string> urls);
  // From now on every attempt is recorded there too (an invoke, then a complete or an info).
  void SetHistory(History* history) { history_ = history; }
  // How long an attempt waits for its answer before the client gives up on it (15 s unless
  // set): a shorter wait makes clients retry while their first attempt is still running.
  void SetReadTimeout(std::chrono::milliseconds timeout) { read_timeout_ms_ = timeout.count(); }
  // One attempt; returns true once final.
  bool Attempt(KeyRecord& r, int replica_hint);
  // Retries until final or `deadline` passes.
  void UntilFinal(KeyRecord& r, std::chrono::steady_clock::time_point deadline,
                  int replica_hint = 0);

 private:
  std::mutex mutex_;
  std::vector<std::string> urls_;
  std::atomic<History*> history_{nullptr};
  std::atomic<long long> read_timeout_ms_{15000};
};

// Drives every record not yet final to its final answer from `threads` clients, each retried
// with its own key until `within` has passed (records still open then fail I3).
void Settle(Driver& driver, std::vector<KeyRecord>& records,
            std::chrono::seconds within = std::chrono::seconds(60), int threads = 4);

std::string OrderBody(int i, bool declined);
// A ship_order run's body: an order and an address; `unserviceable` ships to AQ, which the
// shipping participant refuses (422), so the last step fails and payment, then inventory,
// are compensated.
std::string ShipOrderBody(int i, bool declined, bool unserviceable);
// The same run as deliver_order takes it: {"order": ..., "address": ...}.
std::string DeliverOrderBody(int i, bool declined, bool unserviceable);

struct Report {
  long long orders = 0, terminal = 0, double_charges = 0, double_reservations = 0,
            double_shipments = 0, orphan_reservations = 0, orphan_charges = 0, orphan_shipments = 0,
            completed_mismatch = 0, failed_leftover = 0, lost_acks = 0, replay_mismatch = 0;
  // I7: what `idemsaga reconcile` reported (discrepancies and unreadable participants; -1
  // when it could not run), and its report.
  long long reconcile_discrepancies = 0, reconcile_sagas = 0;
  std::string reconcile_report;
  std::string Line(const std::string& scenario, const std::string& extra = "") const;
  bool Clean() const;
};

// I1, I2, I4, I6 over the four databases, I3 (terminal) over `records`, and I7: the product's
// own reconciliation (`idemsaga reconcile`, the real binary) finds nothing. A completed
// place_order holds one reservation and one charge; a completed ship_order or deliver_order
// also one shipment, of that reservation; a failed saga of any holds none. A child's effects
// count as its parent's.
Report CheckInvariants(const Stack& stack, const std::vector<KeyRecord>& records);

// What the databases hold for every place_order key (the history checker's other input): the
// orchestrator's row and the effects at inventory and payment, by parent key.
std::map<KeyId, KeyState> KeyStates(const Stack& stack);

}  // namespace chaos
