#include "orchestrator/amqp/step_queue.hpp"

#include <stdexcept>

#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "steps/client/participant_client.hpp"

namespace idemsaga::orchestrator::amqp {
namespace {

using steps::saga::StepResult;

std::string Header(const common::amqp::Message& m, const char* name) {
  for (const auto& [n, v] : m.headers) {
    if (common::IEquals(n, name)) return v;
  }
  return "";
}

// "<tenant>:<64 hex>" split, or false.
bool ParseCorrelation(const std::string& id, std::string& tenant, std::string& correlation) {
  auto colon = id.rfind(':');
  if (colon == std::string::npos || colon == 0 || id.size() - colon - 1 != 64) return false;
  tenant = id.substr(0, colon);
  correlation = id.substr(colon + 1);
  return correlation.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

QueueParticipantClient::QueueParticipantClient(QueueParticipantOptions options,
                                               store::ReplyStore& replies,
                                               common::metrics::Registry* metrics)
    : options_(std::move(options)), replies_(replies) {
  if (options_.urls.empty()) throw std::invalid_argument("a queue participant needs --amqp-url");
  for (const auto& url : options_.urls) common::amqp::CheckUrl(url);
  if (options_.queue.empty() || options_.reply_queue.empty()) {
    throw std::invalid_argument("a queue participant needs its queue and a reply queue");
  }
  if (options_.service_token.empty()) {
    throw std::invalid_argument("a queue participant needs a service token");
  }
  if (metrics != nullptr) {
    published_ = &metrics
                      ->Counter("idemsaga_step_commands_published_total",
                                "Commands saga steps published to a participant's queue (a "
                                "command published again after its reply timeout included).",
                                {"queue"})
                      .With({options_.queue});
  }
}

QueueParticipantClient::~QueueParticipantClient() = default;

std::string QueueParticipantClient::CorrelationId(const std::string& tenant_id,
                                                  const std::string& derived_key) {
  return tenant_id + ":" + store::ReplyStore::Correlation(derived_key);
}

void QueueParticipantClient::Publish(const common::amqp::Message& message) {
  std::lock_guard lock(mutex_);
  for (int tries = 0;; ++tries) {
    try {
      if (!connection_) {
        // A step's thread waits on this (the others behind the mutex): a broker that does not
        // answer is given up on sooner than the connection's default.
        auto c = std::make_unique<common::amqp::Connection>(options_.urls[node_],
                                                            std::chrono::seconds(2));
        c->DeclareQueue(options_.queue);
        c->Confirm();
        connection_ = std::move(c);
      }
      // Mandatory: a command no queue takes is an error, never silently dropped.
      connection_->Publish(options_.queue, message, true);
      return;
    } catch (const common::amqp::AmqpError&) {
      connection_.reset();
      node_ = (node_ + 1) % options_.urls.size();
      if (tries + 1 >= static_cast<int>(options_.urls.size()) + 1) throw;
    }
  }
}

StepResult QueueParticipantClient::Post(const std::string& path,
                                        const steps::saga::StepContext& ctx,
                                        const nlohmann::json& body) {
  const std::string where = "queue " + options_.queue + " " + path;
  if (auto reply = replies_.Find(ctx.tenant_id, ctx.derived_key)) {
    steps::client::HttpExchange x;
    x.status = reply->status;
    x.body = reply->body;
    x.retry_after = reply->retry_after;
    auto result = steps::client::Interpret(x, ctx, options_.business_errors, where);
    // Only a success or a business refusal is the step's for good. Anything else (in progress
    // elsewhere, a 5xx, a wrong token an operator then fixes) is asked again by a new publish
    // after the runner's backoff, which the participant answers anew, as an HTTP retry is.
    if (result.outcome != steps::saga::Outcome::kSucceeded &&
        result.outcome != steps::saga::Outcome::kTerminal) {
      replies_.Forget(ctx.tenant_id, ctx.derived_key);
    }
    return result;
  }
  common::amqp::Message m;
  m.headers["Idempotency-Key"] = common::FormatIdempotencyKey(ctx.derived_key);
  m.headers["X-Tenant-ID"] = ctx.tenant_id;
  m.headers["Authorization"] = "Bearer " + options_.service_token;
  m.headers["traceparent"] = ctx.trace.Traceparent();
  m.headers["path"] = path;
  m.content_type = "application/json";
  m.body = body.dump();
  m.reply_to = options_.reply_queue;
  m.correlation_id = CorrelationId(ctx.tenant_id, ctx.derived_key);
  m.message_id =
      store::ReplyStore::Correlation(ctx.derived_key) + "-" + std::to_string(ctx.attempt);
  // The row before the publish: a reply never comes for a command we have no row for.
  replies_.Published(ctx.tenant_id, ctx.parent_key, ctx.derived_key);
  try {
    Publish(m);
  } catch (const common::amqp::AmqpError& e) {
    // Not confirmed: perhaps not sent. An earlier publish may have been, which the runner
    // remembers (a step once in doubt stays so).
    auto r = StepResult::Retryable(std::string("could not publish to ") + where + ": " + e.what());
    r.retry_after = std::chrono::milliseconds(1000);
    return r;
  }
  if (published_ != nullptr) published_->Inc();
  // Sent, and perhaps applied: park (busy: never on a thread) until the reply or the timeout.
  auto waiting = StepResult::InDoubt("published to " + where + "; waiting for the reply");
  waiting.busy = true;
  waiting.retry_after = options_.reply_timeout;
  return waiting;
}

StepResult QueueParticipantClient::Compensate(const std::string& path,
                                              const steps::saga::StepContext& ctx) {
  // What every guarded compensation route takes, as over HTTP.
  return Post(path, ctx,
              {{"action_key", ctx.action_key}, {"action_applied", ctx.action_confirmed}});
}

ReplyConsumer::ReplyConsumer(ReplyConsumerOptions options, store::ReplyStore& replies,
                             common::metrics::Registry* metrics)
    : options_(std::move(options)), replies_(replies) {
  if (options_.urls.empty()) throw std::invalid_argument("the reply consumer needs --amqp-url");
  for (const auto& url : options_.urls) common::amqp::CheckUrl(url);
  if (metrics != nullptr) {
    counted_ = &metrics->Counter("idemsaga_step_replies_total",
                                 "Replies from participant queues to saga steps: stored (the "
                                 "first for its command), duplicate (changed nothing), "
                                 "dead_lettered (no command of ours, or no status).",
                                 {"outcome"});
  }
}

ReplyConsumer::~ReplyConsumer() { Stop(); }

void ReplyConsumer::Start() {
  thread_ = std::thread([this] { Run(); });
}

void ReplyConsumer::Stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReplyConsumer::Count(const char* outcome) {
  if (counted_ != nullptr) counted_->With({outcome}).Inc();
}

bool ReplyConsumer::Pause(std::chrono::milliseconds d) {
  std::unique_lock lock(mutex_);
  return !cv_.wait_for(lock, d, [this] { return stopping_.load(); });
}

void ReplyConsumer::WakeRun(const std::string& tenant_id, const std::string& run_key) {
  // The reply may beat the run's park by milliseconds: the run is still on its thread, about
  // to park for the whole reply timeout. Asked again until it has parked (then woken), or
  // `wake_for` has passed (the reply is read at its next look anyway).
  auto until = std::chrono::steady_clock::now() + options_.wake_for;
  while (replies_.Wake(tenant_id, run_key) == store::ReplyStore::Woken::kRunning &&
         std::chrono::steady_clock::now() < until && Pause(std::chrono::milliseconds(20))) {
  }
}

void ReplyConsumer::Handle(common::amqp::Connection& conn, const common::amqp::Delivery& d) {
  const common::amqp::Message& m = d.message;
  std::string tenant, correlation, run_key, why;
  const std::string status_text = Header(m, "status");
  int status = 0;
  if (status_text.size() == 3 && status_text.find_first_not_of("0123456789") == std::string::npos) {
    status = std::stoi(status_text);
  }
  if (!ParseCorrelation(m.correlation_id, tenant, correlation)) {
    why = "the correlation_id names no command of a saga step";
  } else if (status < 100 || status > 599) {
    why = "a reply needs the string header `status` (an HTTP status)";
  } else {
    switch (
        replies_.Answer(tenant, correlation, status, Header(m, "Retry-After"), m.body, run_key)) {
      case store::ReplyStore::Answered::kStored:
        WakeRun(tenant, run_key);
        conn.Ack(d.tag);
        Count("stored");
        return;
      case store::ReplyStore::Answered::kDuplicate:
        conn.Ack(d.tag);
        Count("duplicate");
        return;
      case store::ReplyStore::Answered::kUnknown:
        why = "no command of a saga step has this correlation_id (its run is gone?)";
        break;
    }
  }
  common::amqp::Message dead = m;
  dead.headers["x-idemsaga-error"] = "reply_not_taken";
  dead.headers["x-idemsaga-detail"] = why;
  conn.Publish(options_.queue + ".dead", dead, true);
  conn.Ack(d.tag);
  common::Log("step_reply_dead_lettered",
              {{"queue", options_.queue}, {"correlation_id", m.correlation_id}, {"why", why}});
  Count("dead_lettered");
}

void ReplyConsumer::Run() {
  size_t node = 0;
  while (!stopping_) {
    const std::string& url = options_.urls[node];
    try {
      common::amqp::Connection conn(url);
      conn.DeclareQueue(options_.queue);
      conn.DeclareQueue(options_.queue + ".dead");
      conn.Confirm();
      // One reply in hand: a delivery that came while a dead letter's confirm was awaited
      // would be dropped by the connection (it reads one message at a time).
      conn.Prefetch(1);
      conn.Consume(options_.queue);
      common::Log("step_replies_connected",
                  {{"queue", options_.queue}, {"node", common::amqp::Address(url)}});
      while (!stopping_) {
        if (auto d = conn.Next(std::chrono::milliseconds(200))) Handle(conn, *d);
      }
      return;
    } catch (const std::exception& e) {
      // The broker or the database went away with replies in hand: they go back to the queue
      // with the connection, and are stored by the next one.
      common::Log(
          "step_replies_disconnected",
          {{"queue", options_.queue}, {"node", common::amqp::Address(url)}, {"error", e.what()}});
      node = (node + 1) % options_.urls.size();
      Pause(options_.reconnect_backoff);
    }
  }
}

}  // namespace idemsaga::orchestrator::amqp
