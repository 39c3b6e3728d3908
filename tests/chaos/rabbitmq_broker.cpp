#include "tests/chaos/rabbitmq_broker.hpp"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/amqp/connection.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/pg/cluster.hpp"
#include "common/process.hpp"

namespace chaos {

RabbitBroker::RabbitBroker(std::string dir, RabbitNodeOptions options)
    : dir_(std::move(dir)),
      options_(std::move(options)),
      amqp_port_(idemsaga::common::FreeLoopbackPort()),
      dist_port_(idemsaga::common::FreeLoopbackPort()) {
  std::filesystem::create_directories(dir_);
  if (options_.name.empty()) {
    options_.name = "idemsaga-test-" + std::to_string(amqp_port_) + "@localhost";
  }
  if (options_.home.empty()) options_.home = dir_;
  std::ofstream(dir_ + "/rabbitmq.conf")
      << "listeners.tcp.default = 127.0.0.1:" << amqp_port_ << "\n"
      << "loopback_users = none\n";
  std::ofstream(dir_ + "/enabled_plugins") << "[].\n";
  if (options_.epmd_port == 0) {
    // The node's name server, ours (not one shared with other Erlang nodes on the machine).
    options_.epmd_port = idemsaga::common::FreeLoopbackPort();
    epmd_ = std::make_unique<Process>(
        std::vector<std::string>{"/usr/bin/epmd", "-port", std::to_string(options_.epmd_port),
                                 "-address", "127.0.0.1"},
        std::map<std::string, std::string>{}, dir_ + "/epmd.log");
  }
  if (options_.start) Start();
}

RabbitBroker::~RabbitBroker() {
  if (server_) Stop();
}

std::string RabbitBroker::Url() const {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(amqp_port_);  // vhost "/"
}

void RabbitBroker::Start() {
  Launch();
  WaitReady();
}

void RabbitBroker::Launch() {
  std::map<std::string, std::string> env = {
      {"HOME", options_.home},  // the Erlang cookie
      // Under "systemd" the script execs the VM in the foreground (no wrapper shell), so the
      // PID we hold is the broker's own and signals reach it.
      {"NOTIFY_SOCKET", dir_ + "/no-systemd"},
      {"ERL_EPMD_PORT", std::to_string(options_.epmd_port)},
      {"RABBITMQ_NODENAME", options_.name},
      {"RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1"},
      {"RABBITMQ_NODE_PORT", std::to_string(amqp_port_)},
      {"RABBITMQ_DIST_PORT", std::to_string(dist_port_)},
      {"RABBITMQ_CONFIG_FILE", dir_ + "/rabbitmq.conf"},
      {"RABBITMQ_ADVANCED_CONFIG_FILE", dir_ + "/advanced.config"},
      {"RABBITMQ_ENABLED_PLUGINS_FILE", dir_ + "/enabled_plugins"},
      {"RABBITMQ_CONF_ENV_FILE", "/dev/null"},
      {"RABBITMQ_MNESIA_BASE", dir_ + "/mnesia"},
      {"RABBITMQ_LOG_BASE", dir_ + "/log"},
      {"RABBITMQ_LOGS", "-"}};
  server_ =
      std::make_unique<Process>(std::vector<std::string>{"/usr/lib/rabbitmq/bin/rabbitmq-server"},
                                env, dir_ + "/rabbitmq.log");
}

void RabbitBroker::WaitReady() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (;;) {
    try {
      idemsaga::common::amqp::Connection probe(Url(), std::chrono::seconds(2));
      return;
    } catch (const idemsaga::common::amqp::AmqpError&) {
    }
    if (server_->Exited(std::chrono::milliseconds(0))) {
      throw std::runtime_error("rabbitmq-server exited; see " + dir_ + "/rabbitmq.log");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("rabbitmq-server not ready after 90 s; see " + dir_ +
                               "/rabbitmq.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

void RabbitBroker::Stop() {
  server_->Signal(SIGTERM);
  if (!server_->Exited(std::chrono::seconds(60))) server_->Kill();
  server_.reset();
}

void RabbitBroker::Kill() {
  server_->Kill();
  server_.reset();
}

std::string RabbitBroker::Ctl(const std::vector<std::string>& args) const {
  // `env`: the CLI is an Erlang node too, and must find this node's epmd and cookie.
  // Its warnings (stderr) go to the node's log, not the test's output.
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "exec \"$@\" 2>>" + dir_ + "/rabbitmqctl.log",
                                   "sh",
                                   "/usr/bin/env",
                                   "HOME=" + options_.home,
                                   "ERL_EPMD_PORT=" + std::to_string(options_.epmd_port),
                                   "RABBITMQ_CONF_ENV_FILE=/dev/null",
                                   "/usr/lib/rabbitmq/bin/rabbitmqctl",
                                   "-n",
                                   options_.name,
                                   "-q"};
  argv.insert(argv.end(), args.begin(), args.end());
  return idemsaga::common::ReadProgramOutput(argv);
}

RabbitCluster::RabbitCluster(std::string dir, int size) : dir_(std::move(dir)) {
  std::filesystem::create_directories(dir_);
  // One cookie for every node and for rabbitmqctl; Erlang refuses one others may read.
  std::random_device random;
  std::string cookie;
  for (int i = 0; i < 20; ++i) cookie += static_cast<char>('A' + random() % 26);
  std::string cookie_path = dir_ + "/.erlang.cookie";
  std::ofstream(cookie_path) << cookie;
  std::filesystem::permissions(cookie_path, std::filesystem::perms::owner_read);
  int epmd_port = idemsaga::common::FreeLoopbackPort();
  epmd_ = std::make_unique<Process>(
      std::vector<std::string>{"/usr/bin/epmd", "-port", std::to_string(epmd_port), "-address",
                               "127.0.0.1"},
      std::map<std::string, std::string>{}, dir_ + "/epmd.log");
  for (int i = 0; i < size; ++i) {
    std::string n = "q" + std::to_string(i + 1);
    nodes_.push_back(std::make_unique<RabbitBroker>(
        dir_ + "/" + n, RabbitNodeOptions{.name = "idemsaga-" + n + "@localhost",
                                          .home = dir_,
                                          .epmd_port = epmd_port,
                                          .start = false}));
  }
  // They boot side by side (the slow part), then join the first one by one.
  for (auto& node : nodes_) node->Launch();
  for (auto& node : nodes_) node->WaitReady();
  for (int i = 1; i < size; ++i) {
    auto& node = *nodes_[i];
    node.Ctl({"stop_app"});
    node.Ctl({"reset"});
    node.Ctl({"join_cluster", nodes_[0]->name()});
    node.Ctl({"start_app"});
  }
  auto status = nlohmann::json::parse(Ctl({"cluster_status", "--formatter", "json"}));
  if (status["running_nodes"].size() != nodes_.size()) {
    throw std::runtime_error("the cluster did not form: " + status.dump());
  }
}

std::vector<std::string> RabbitCluster::Urls() const {
  std::vector<std::string> urls;
  for (const auto& node : nodes_) urls.push_back(node->Url());
  return urls;
}

std::string RabbitCluster::Ctl(const std::vector<std::string>& args) const {
  for (const auto& node : nodes_) {
    if (node->running()) return node->Ctl(args);
  }
  throw std::runtime_error("no node of the cluster is running");
}

int RabbitCluster::NodeOf(const std::string& pid) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (pid.find("<" + nodes_[i]->name() + ".") == 0) return static_cast<int>(i);
  }
  return -1;
}

idemsaga::common::amqp::Message AmqpOrder(const KeyRecord& r, const std::string& reply_to,
                                          const std::string& correlation_id) {
  idemsaga::common::amqp::Message m;
  m.headers["Idempotency-Key"] = idemsaga::common::FormatIdempotencyKey(r.key);
  m.headers["Authorization"] = "Bearer dev-key-" + r.tenant;
  m.content_type = "application/json";
  m.reply_to = reply_to;
  m.correlation_id = correlation_id;
  m.body = r.body;
  return m;
}

void BrokerSuite::SetUpTestSuite() {
  idemsaga::common::SetLogEnabled(false);
  broker_dir_ = idemsaga::common::pg::PrivateCluster::MakeTempDir().string();
  broker_ = new RabbitBroker(broker_dir_);
}

void BrokerSuite::TearDownTestSuite() {
  delete broker_;
  broker_ = nullptr;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(broker_dir_);
}

}  // namespace chaos
