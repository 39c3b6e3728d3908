// --amqp-url, --amqp-queue, --amqp-queue-type, --amqp-consumers, --amqp-max-wait-ms: a
// participant's commands from RabbitMQ (docs/messaging.md), the same flags in the library's
// Participant::Run and the stock participants' commands alike.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>
#include <vector>

namespace idemsaga::app {

struct AmqpCommandFlags {
  std::vector<std::string> urls;  // none: HTTP only
  std::string queue;              // "": the participant's name
  std::string queue_type = "classic";
  int consumers = 2;
  long long max_wait_ms = 120000;
};

// `env_prefix` names the variables of the URL and the queue ("IDEMSAGA_SHIPPING_": one
// environment may hold every service's, and no participant takes the orchestrator's queue);
// the others are IDEMSAGA_AMQP_*, as the orchestrator's.
inline void AddAmqpCommandOptions(CLI::App* cmd, AmqpCommandFlags& flags,
                                  const std::string& env_prefix) {
  cmd->add_option("--amqp-url", flags.urls,
                  "also take commands from RabbitMQ (docs/messaging.md): "
                  "amqp://user:password@host:port/vhost; for a cluster, one per node "
                  "(repeatable, or comma-separated)")
      ->envname(env_prefix + "AMQP_URL")
      ->delimiter(',');
  cmd->add_option("--amqp-queue", flags.queue,
                  "the queue commands come from (default: the participant's name; refused ones "
                  "go to QUEUE.dead)")
      ->envname(env_prefix + "AMQP_QUEUE");
  cmd->add_option("--amqp-queue-type", flags.queue_type,
                  "classic or quorum: what the queues are declared as when they do not exist")
      ->check(CLI::IsMember({"classic", "quorum"}, CLI::ignore_case))
      ->envname("IDEMSAGA_AMQP_QUEUE_TYPE")
      ->capture_default_str();
  cmd->add_option("--amqp-consumers", flags.consumers,
                  "connections consuming the queue, each with one message in hand at a time")
      ->check(CLI::Range(1, 256))
      ->envname("IDEMSAGA_AMQP_CONSUMERS")
      ->capture_default_str();
  cmd->add_option("--amqp-max-wait-ms", flags.max_wait_ms,
                  "how long a command asked to come back (503, 409 in progress) is retried in "
                  "hand before it goes back to the queue")
      ->check(CLI::Range(1LL, 24LL * 3600 * 1000))
      ->envname("IDEMSAGA_AMQP_MAX_WAIT_MS")
      ->capture_default_str();
}

}  // namespace idemsaga::app
