// Saga steps over messaging (issue 34, part 5): a participant reached through a RabbitMQ queue
// instead of HTTP, and the consumer of its replies.
//
// QueueParticipantClient is an idemsaga::ParticipantClient: a step's Post (or Compensate)
// publishes the command to the participant's queue as the HTTP client sends it (the derived
// key in `Idempotency-Key` as an sf-string, `X-Tenant-ID`, `Authorization: Bearer <service
// token>`, `traceparent`, and the route in `path`; the JSON body), confirmed, with
// `reply_to` = the orchestrator's reply queue and `correlation_id` = "<tenant>:<sha256 of the
// derived key>" (AMQP's correlation id holds 255 bytes, a derived key may alone). It writes the
// command's row first (store::ReplyStore: no transaction is open across the publish), and then
// answers "in doubt, busy, retry after `reply_timeout`": the runner parks the saga (no thread)
// until the reply wakes it or the timeout passes. At the next attempt (any replica, after any
// crash) the stored reply is the step's answer, mapped exactly as an HTTP answer is
// (steps::client::Interpret); without one the command is published again under the same key,
// which the participant's guard replays: never a second effect.
//
// ReplyConsumer consumes the reply queue: a reply (the participant's answer as its guard gave
// it: the string header `status`, `Retry-After` if any, the body) is stored for its command
// and wakes the command's run if it is parked; a duplicate or late reply changes nothing. A
// reply that names no command of ours, or no status, goes to `<reply queue>.dead` with the
// reason. Acked only once stored: a crash before redelivers it.
//
// Thread-safe: Start() once, Stop() from any thread.
//   amqp::ReplyConsumer replies_in({.urls = {url}, .queue = "idemsaga.replies"}, store);
//   amqp::QueueParticipantClient shipping({.urls = {url}, .queue = "shipping.commands",
//                                          .reply_queue = "idemsaga.replies", ...}, store);
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/amqp/connection.hpp"
#include "common/metrics.hpp"
#include "orchestrator/store/reply_store.hpp"
#include "steps/saga/step.hpp"

namespace idemsaga::orchestrator::amqp {

struct QueueParticipantOptions {
  std::vector<std::string> urls;  // amqp://..., one per node; the next one after a failure
  std::string queue;              // the participant's command queue
  std::string reply_queue = "idemsaga.replies";
  // Required (the constructor throws without it), as for the HTTP client.
  std::string service_token;
  // The participant's business refusals: the only 4xx codes that fail a saga for good.
  std::set<std::string> business_errors;
  // How long a step waits, parked, for a reply before it publishes its command again.
  std::chrono::milliseconds reply_timeout{10000};
};

class QueueParticipantClient final : public idemsaga::ParticipantClient {
 public:
  QueueParticipantClient(QueueParticipantOptions options, store::ReplyStore& replies,
                         common::metrics::Registry* metrics = nullptr);
  ~QueueParticipantClient() override;

  steps::saga::StepResult Post(const std::string& path, const steps::saga::StepContext& ctx,
                               const nlohmann::json& body) override;
  steps::saga::StepResult Compensate(const std::string& path,
                                     const steps::saga::StepContext& ctx) override;

  // The correlation id of a command: "<tenant>:<sha256 hex of the derived key>".
  static std::string CorrelationId(const std::string& tenant_id, const std::string& derived_key);

 private:
  // Publishes with confirms on this client's connection, made again (on the next node) after
  // a failure; throws common::amqp::AmqpError when that fails too.
  void Publish(const common::amqp::Message& message);

  QueueParticipantOptions options_;
  store::ReplyStore& replies_;
  common::metrics::Counter* published_ = nullptr;
  std::mutex mutex_;  // a Connection is one thread's at a time
  std::unique_ptr<common::amqp::Connection> connection_;
  size_t node_ = 0;
};

struct ReplyConsumerOptions {
  std::vector<std::string> urls;
  std::string queue = "idemsaga.replies";
  // How long a reply that found its run still running (about to park) keeps asking to wake it.
  std::chrono::milliseconds wake_for{2000};
  std::chrono::milliseconds reconnect_backoff{500};
};

class ReplyConsumer {
 public:
  // Counts replies in idemsaga_step_replies_total{outcome="stored"|"duplicate"|"dead_lettered"}.
  ReplyConsumer(ReplyConsumerOptions options, store::ReplyStore& replies,
                common::metrics::Registry* metrics = nullptr);
  ~ReplyConsumer();
  void Start();
  void Stop();

 private:
  void Run();
  void Handle(common::amqp::Connection& conn, const common::amqp::Delivery& d);
  void WakeRun(const std::string& tenant_id, const std::string& run_key);
  void Count(const char* outcome);
  bool Pause(std::chrono::milliseconds d);

  ReplyConsumerOptions options_;
  store::ReplyStore& replies_;
  common::metrics::Family<common::metrics::Counter>* counted_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace idemsaga::orchestrator::amqp
