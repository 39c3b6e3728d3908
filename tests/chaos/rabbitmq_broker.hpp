// Private RabbitMQ brokers for tests: rabbitmq-server from Debian's package with a node, ports
// (AMQP, distribution, epmd) and a data directory of its own, on loopback, and no plugins; and
// a cluster of three such nodes with one Erlang cookie and one epmd. Their processes die with
// the thread that started them (chaos::Process), so nothing outlives the test. Restartable on
// the same data: durable queues and persistent messages survive Stop()/Start(), as they
// survive a broker restart in production, and a cluster's node rejoins its cluster.
//
// Not thread-safe.
//   chaos::RabbitBroker broker(dir);   // started; broker.Url() is amqp://guest:guest@...
//   broker.Stop(); broker.Start();
//   chaos::RabbitCluster cluster(dir);  // three nodes, joined; cluster.Urls()
//   cluster.node(0).Kill(); cluster.node(0).Start();
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/amqp/connection.hpp"
#include "tests/chaos/chaos_harness.hpp"

namespace chaos {

struct RabbitNodeOptions {
  std::string name;   // the Erlang node name; "": idemsaga-test-<AMQP port>@localhost
  std::string home;   // HOME, where its Erlang cookie is; "": its own directory
  int epmd_port = 0;  // the name server its cluster shares; 0: one of its own, started here
  bool start = true;  // false: the owner calls Launch() and WaitReady()
};

class RabbitBroker {
 public:
  // In `dir` (created), logging to dir/rabbitmq.log; started unless options.start is false.
  explicit RabbitBroker(std::string dir, RabbitNodeOptions options = {});
  ~RabbitBroker();

  std::string Url() const;
  const std::string& name() const { return options_.name; }
  bool running() const { return server_ != nullptr; }
  void Start();  // Launch() and WaitReady()
  void Launch();
  // Until it accepts AMQP connections (throws after 90 s, or when it exited).
  void WaitReady();
  void Stop();  // SIGTERM: a clean shutdown, waited for
  void Kill();  // SIGKILL: a crash
  // rabbitmqctl against this node (the CLI of the package, run as its own Erlang node), with
  // `args` after `-q`; returns what it printed, throws std::runtime_error when it failed.
  std::string Ctl(const std::vector<std::string>& args) const;

 private:
  std::string dir_;
  RabbitNodeOptions options_;
  int amqp_port_, dist_port_;
  std::unique_ptr<Process> epmd_;
  std::unique_ptr<Process> server_;
};

// Three nodes (idemsaga-q1@localhost ...) joined into one cluster with rabbitmqctl
// join_cluster, each with its own ports and data directory under `dir`. A quorum queue
// declared on it is replicated on all three, so it survives any one of them.
class RabbitCluster {
 public:
  explicit RabbitCluster(std::string dir, int size = 3);

  int size() const { return static_cast<int>(nodes_.size()); }
  RabbitBroker& node(int i) { return *nodes_.at(i); }
  std::vector<std::string> Urls() const;
  // rabbitmqctl through the first running node.
  std::string Ctl(const std::vector<std::string>& args) const;
  // Index of the node an Erlang pid (as rabbitmqctl prints it: <idemsaga-q1@localhost.1.2.0>)
  // lives on; -1 for none.
  int NodeOf(const std::string& pid) const;

 private:
  std::string dir_;
  std::unique_ptr<Process> epmd_;
  std::vector<std::unique_ptr<RabbitBroker>> nodes_;
};

// A test suite with one private broker for all of its tests: started before the first, stopped
// after the last, its directory kept when a test failed; the test process's own log lines off.
class BrokerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  static inline RabbitBroker* broker_ = nullptr;
  static inline std::string broker_dir_;
};

// An order message as a client publishes it: the key as an sf-string header, the tenant's API
// key, a reply queue.
idemsaga::common::amqp::Message AmqpOrder(const KeyRecord& r, const std::string& reply_to,
                                          const std::string& correlation_id);

}  // namespace chaos
