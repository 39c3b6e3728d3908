#include "tests/chaos/rabbitmq_broker.hpp"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "common/net.hpp"
#include "orchestrator/amqp/connection.hpp"

namespace chaos {

RabbitBroker::RabbitBroker(std::string dir)
    : dir_(std::move(dir)),
      amqp_port_(idemsaga::common::FreeLoopbackPort()),
      dist_port_(idemsaga::common::FreeLoopbackPort()),
      epmd_port_(idemsaga::common::FreeLoopbackPort()) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/rabbitmq.conf")
      << "listeners.tcp.default = 127.0.0.1:" << amqp_port_ << "\n"
      << "loopback_users = none\n";
  std::ofstream(dir_ + "/enabled_plugins") << "[].\n";
  // The node's name server, ours (not one shared with other Erlang nodes on the machine).
  epmd_ = std::make_unique<Process>(
      std::vector<std::string>{"/usr/bin/epmd", "-port", std::to_string(epmd_port_), "-address",
                               "127.0.0.1"},
      std::map<std::string, std::string>{}, dir_ + "/epmd.log");
  Start();
}

RabbitBroker::~RabbitBroker() {
  if (server_) Stop();
}

std::string RabbitBroker::Url() const {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(amqp_port_);  // vhost "/"
}

void RabbitBroker::Start() {
  std::map<std::string, std::string> env = {
      {"HOME", dir_},  // the Erlang cookie
      // Under "systemd" the script execs the VM in the foreground (no wrapper shell), so the
      // PID we hold is the broker's own and signals reach it.
      {"NOTIFY_SOCKET", dir_ + "/no-systemd"},
      {"ERL_EPMD_PORT", std::to_string(epmd_port_)},
      {"RABBITMQ_NODENAME", "idemsaga-test-" + std::to_string(amqp_port_) + "@localhost"},
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
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (;;) {
    try {
      idemsaga::orchestrator::amqp::Connection probe(Url(), std::chrono::seconds(2));
      return;
    } catch (const idemsaga::orchestrator::amqp::AmqpError&) {
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

}  // namespace chaos
