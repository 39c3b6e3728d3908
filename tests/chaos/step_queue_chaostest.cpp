// Saga steps over RabbitMQ (issue 34, part 5): ship_order version 2 calls shipping through its
// command queue (orchestrator --participant-queue), with a real broker of the test's own, real
// `idemsaga` processes and the fault suite's invariant checker over the four databases. The
// broker faults of the issue: a reply lost (the step publishes again after its reply timeout,
// the participant replays: one shipment), a duplicate reply (changes nothing), no reply before
// the step's deadline (the shipment is compensated over the queue), a consumer killed between
// the effect and its ack, and a broker restart mid-step.
//
// In the fault scenarios the shipping participant takes its commands from the queue through
// QueueShipping below: a consumer in this process that hands each command to the real shipping
// participant's guarded route (the key, tenant, token and traceparent as they came) and replies
// with its answer as docs/messaging.md has it (`status`, the body) before the ack; it is where
// the faults are injected. The last scenario runs the stock shipping participant consuming its
// own queue, killed -9 mid-step.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <pqxx/pqxx>
#include <set>
#include <sstream>
#include <thread>

#include "common/amqp/connection.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/pg/cluster.hpp"
#include "demo/stack.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/rabbitmq_broker.hpp"

namespace {

using chaos::KeyRecord;
using chaos::Stack;
using idemsaga::common::amqp::Connection;
using idemsaga::common::amqp::Message;
using Clock = std::chrono::steady_clock;

// What QueueShipping does to the commands under some derived keys (their raw bytes).
struct Faults {
  std::set<std::string> lose_first_reply;  // the first reply is never published
  std::set<std::string> lose_every_reply;  // no reply is ever published
  std::set<std::string> duplicate_reply;   // every reply is published twice
  std::set<std::string>
      die_before_ack;  // the first delivery: effect, reply, no ack, connection gone
};

// The shipping participant's queue consumer (see the top of the file). Runs on a thread of its
// own until destroyed; reconnects after the broker went away.
class QueueShipping {
 public:
  QueueShipping(std::string amqp_url, std::string queue, std::string shipping_url, Faults faults)
      : url_(std::move(amqp_url)),
        queue_(std::move(queue)),
        shipping_url_(std::move(shipping_url)),
        faults_(std::move(faults)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~QueueShipping() {
    stopping_ = true;
    thread_.join();
  }

  struct Seen {
    std::string idempotency_key, tenant, traceparent, path, authorization;
    int deliveries = 0, replies_published = 0;
  };
  // By derived key.
  std::map<std::string, Seen> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }
  int connections() const { return connections_; }

 private:
  void Run() {
    while (!stopping_) {
      try {
        Connection conn(url_);
        conn.DeclareQueue(queue_);
        conn.Confirm();
        conn.Prefetch(1);  // the connection reads one delivery at a time (see ReplyConsumer)
        conn.Consume(queue_);
        ++connections_;
        while (!stopping_) {
          auto d = conn.Next(std::chrono::milliseconds(100));
          if (d && !Handle(conn, *d)) break;  // "killed" before the ack: drop the connection
        }
      } catch (const std::exception&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }

  // False: the consumer dies here (its connection is dropped, the delivery not acked).
  bool Handle(Connection& conn, const idemsaga::common::amqp::Delivery& d) {
    const Message& m = d.message;
    auto header = [&](const char* name) {
      auto it = m.headers.find(name);
      return it == m.headers.end() ? std::string() : it->second;
    };
    auto parsed = idemsaga::common::ParseIdempotencyKey(1, header("Idempotency-Key"), 255);
    const std::string key = parsed.ok() ? parsed.key : "";
    int delivery;
    {
      std::lock_guard lock(mutex_);
      auto& s = seen_[key];
      s = {header("Idempotency-Key"), header("X-Tenant-ID"), header("traceparent"), header("path"),
           header("Authorization"),   s.deliveries + 1,      s.replies_published};
      delivery = s.deliveries;
    }
    httplib::Client c(shipping_url_);
    c.set_read_timeout(5, 0);
    auto r = c.Post(header("path"),
                    {{"Authorization", header("Authorization")},
                     {"X-Tenant-ID", header("X-Tenant-ID")},
                     {"Idempotency-Key", header("Idempotency-Key")},
                     {"traceparent", header("traceparent")}},
                    m.body, "application/json");
    if (!r) {  // the participant is away: the command waits in the queue
      conn.Reject(d.tag, true);
      return true;
    }
    Message reply;
    reply.correlation_id = m.correlation_id;
    reply.content_type = "application/json";
    reply.headers["status"] = std::to_string(r->status);
    if (r->has_header("Retry-After"))
      reply.headers["Retry-After"] = r->get_header_value("Retry-After");
    reply.body = r->body;
    int copies = faults_.lose_every_reply.count(key) != 0 ||
                         (delivery == 1 && faults_.lose_first_reply.count(key) != 0)
                     ? 0
                 : faults_.duplicate_reply.count(key) != 0 ? 2
                                                           : 1;
    for (int i = 0; i < copies; ++i) conn.Publish(m.reply_to, reply);
    {
      std::lock_guard lock(mutex_);
      seen_[key].replies_published += copies;
    }
    if (delivery == 1 && faults_.die_before_ack.count(key) != 0) return false;
    conn.Ack(d.tag);
    return true;
  }

  std::string url_, queue_, shipping_url_;
  Faults faults_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex mutex_;
  std::map<std::string, Seen> seen_;
  std::thread thread_;
};

class StepQueue : public chaos::BrokerSuite {
 protected:
  // A stack whose orchestrator reaches shipping_queue through shipping_NAME, replies on
  // replies_NAME after at most `reply_timeout_ms`.
  static std::unique_ptr<Stack> Started(const std::string& name, int reply_timeout_ms,
                                        const std::vector<std::string>& more = {}) {
    chaos::StackOptions o;
    o.max_attempts = 1000;  // each wait for a reply is an attempt: the deadline ends a step
    o.orchestrator_args = {"--amqp-url",
                           broker_->Url(),
                           "--amqp-queue",
                           "orders_" + name,
                           "--amqp-consumers",
                           "1",
                           "--participant-queue",
                           "shipping_queue=shipping_" + name,
                           "--step-reply-queue",
                           "replies_" + name,
                           "--step-reply-timeout-ms",
                           std::to_string(reply_timeout_ms)};
    o.orchestrator_args.insert(o.orchestrator_args.end(), more.begin(), more.end());
    auto stack = std::make_unique<Stack>("stepq_" + name, o);
    stack->StartParticipants();
    stack->StartOrchestrator(0);
    return stack;
  }

  static std::vector<KeyRecord> Runs(const std::string& prefix, int n,
                                     const std::set<int>& unserviceable = {}) {
    std::vector<KeyRecord> records;
    for (int i = 0; i < n; ++i) {
      records.push_back({"demo", prefix + "-" + std::to_string(i),
                         chaos::ShipOrderBody(i, false, unserviceable.count(i) != 0),
                         chaos::kShipOrder});
    }
    return records;
  }

  static long long Count(const std::string& url, const std::string& sql) {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    return tx.exec(sql)[0][0].as<long long>();
  }

  // The invariants at 0, and the figures printed.
  static void ExpectClean(const Stack& stack, const std::vector<KeyRecord>& records,
                          const std::string& scenario, const std::string& extra) {
    auto report = chaos::CheckInvariants(stack, records);
    std::cout << report.Line(scenario, extra) << std::endl;
    EXPECT_TRUE(report.Clean()) << report.reconcile_report;
  }
};

// Every run of ship_order is version 2, its shipping step went through the queue with the
// derived key's exact bytes, the tenant, the service token and the run's trace, one publish
// and one reply each; a refused address fails the run and compensates the steps before.
TEST_F(StepQueue, ShipsOverTheQueueAndARefusalCompensates) {
  auto stack = Started("happy", 10000);
  QueueShipping shipping(broker_->Url(), "shipping_happy", stack->ParticipantUrl("shipping"), {});
  auto records = Runs("happy", 8, {3, 7});
  chaos::Driver driver({stack->OrchestratorUrl(0)});
  auto start = Clock::now();
  chaos::Settle(driver, records, std::chrono::seconds(90));
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  const auto orch = stack->DatabaseUrl("orchestrator");
  EXPECT_EQ(Count(orch,
                  "SELECT count(*) FROM idempotency_keys WHERE saga_version = 2 "
                  "AND saga_name = 'ship_order'"),
            8);
  EXPECT_EQ(Count(orch,
                  "SELECT count(*) FROM saga_step_replies WHERE derived_key LIKE "
                  "'%-shipping' AND publishes = 1 AND replies = 1 AND reply_status IS "
                  "NOT NULL"),
            8);
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM shipments WHERE status = 'created'"),
            6);
  auto seen = shipping.seen();
  pqxx::connection c(orch);
  pqxx::nontransaction tx(c);
  for (const auto& r : records) {
    const std::string key = r.key + "-shipping";
    ASSERT_EQ(seen.count(key), 1U) << key;
    const auto& s = seen[key];
    EXPECT_EQ(s.idempotency_key, idemsaga::common::FormatIdempotencyKey(key));
    EXPECT_EQ(s.tenant, "demo");
    EXPECT_EQ(s.path, "/v1/shipments");
    EXPECT_EQ(s.authorization, std::string("Bearer ") + idemsaga::demo::kServiceToken);
    auto trace = tx.exec_params1(
                       "SELECT trace_id FROM idempotency_keys WHERE tenant_id = "
                       "'demo' AND idempotency_key = $1",
                       r.key)[0]
                     .as<std::string>();
    EXPECT_EQ(s.traceparent.substr(3, 32), trace) << key;
    bool refused = r.key == "happy-3" || r.key == "happy-7";
    EXPECT_EQ(r.final_status, refused ? 422 : 201) << r.key << " " << r.final_body;
  }
  ExpectClean(*stack, records, "step_queue_happy",
              "runs=8 clients=4 wall_ms=" + std::to_string(took.count()));
}

// A reply lost: the step publishes its command again after the reply timeout, the
// participant's guard replays, one shipment. A reply sent twice: the second changes nothing.
TEST_F(StepQueue, ALostReplyIsRepublishedAndADuplicateChangesNothing) {
  auto stack = Started("replies", 1500);
  auto records = Runs("replies", 9);
  Faults faults;
  for (int i = 0; i < 9; ++i) {
    auto key = records[i].key + "-shipping";
    if (i % 3 == 0) faults.lose_first_reply.insert(key);
    if (i % 3 == 1) faults.duplicate_reply.insert(key);
  }
  QueueShipping shipping(broker_->Url(), "shipping_replies", stack->ParticipantUrl("shipping"),
                         faults);
  chaos::Driver driver({stack->OrchestratorUrl(0)});
  chaos::Settle(driver, records, std::chrono::seconds(90));
  const auto orch = stack->DatabaseUrl("orchestrator");
  auto seen = shipping.seen();
  long long republished = 0, duplicates = 0;
  for (int i = 0; i < 9; ++i) {
    auto key = records[i].key + "-shipping";
    EXPECT_EQ(records[i].final_status, 201) << records[i].final_body;
    if (i % 3 == 0) {
      EXPECT_GE(seen[key].deliveries, 2) << key;  // published again, replayed
      ++republished;
    }
    if (i % 3 == 1) duplicates += seen[key].replies_published - 1;
  }
  EXPECT_EQ(Count(orch, "SELECT count(*) FROM saga_step_replies WHERE publishes >= 2"), 3);
  EXPECT_EQ(Count(orch, "SELECT coalesce(sum(replies - 1), 0) FROM saga_step_replies"),
            duplicates + 0);
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM shipments WHERE status = 'created'"),
            9);
  // The participant applied each command once, and replayed every other copy.
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM idempotency_keys WHERE idempotency_key LIKE '%-shipping'"),
            9);
  ExpectClean(*stack, records, "step_queue_replies",
              "lost_replies=" + std::to_string(republished) +
                  " duplicate_replies=" + std::to_string(duplicates));
}

// No reply ever for two runs' shipping: past the step's deadline the step is in doubt, so the
// saga fails and compensates it over the queue (the shipment is cancelled), then payment and
// inventory.
TEST_F(StepQueue, NoReplyBeforeTheDeadlineCompensatesOverTheQueue) {
  auto stack = Started("deadline", 1500, {"--step-deadline-ms", "5000"});
  auto records = Runs("deadline", 4);
  Faults faults;
  faults.lose_every_reply = {"deadline-0-shipping", "deadline-2-shipping"};
  QueueShipping shipping(broker_->Url(), "shipping_deadline", stack->ParticipantUrl("shipping"),
                         faults);
  chaos::Driver driver({stack->OrchestratorUrl(0)});
  chaos::Settle(driver, records, std::chrono::seconds(90));
  auto seen = shipping.seen();
  for (int i = 0; i < 4; ++i) {
    bool lost = i % 2 == 0;
    EXPECT_EQ(records[i].final_status, lost ? 502 : 201)
        << records[i].key << " " << records[i].final_body;
    auto compensation = records[i].key + "-shipping-compensate";
    EXPECT_EQ(seen.count(compensation), lost ? 1U : 0U) << compensation;
    if (lost) {
      EXPECT_EQ(seen[compensation].path, "/v1/shipments/cancel");
    }
  }
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM shipments WHERE status = 'cancelled'"),
            2);
  ExpectClean(*stack, records, "step_queue_deadline", "compensated_over_queue=2");
}

// The consumer dies between the effect and its ack for some commands (redelivered: the guard
// replays), and the broker restarts while runs are waiting for replies: one shipment each.
TEST_F(StepQueue, ConsumerKilledBeforeAckAndBrokerRestartMidStep) {
  auto stack = Started("restart", 2000);
  auto records = Runs("restart", 12, {5});
  Faults faults;
  for (int i = 0; i < 12; i += 4) faults.die_before_ack.insert(records[i].key + "-shipping");
  int consumer_connections = 0;
  {
    QueueShipping shipping(broker_->Url(), "shipping_restart", stack->ParticipantUrl("shipping"),
                           faults);
    chaos::Driver driver({stack->OrchestratorUrl(0)});
    std::thread settle([&] { chaos::Settle(driver, records, std::chrono::seconds(120)); });
    // Once some runs are waiting on the queue; on this thread, which the broker's process
    // dies with.
    for (auto until = Clock::now() + std::chrono::seconds(30);
         Clock::now() < until && shipping.seen().size() < 3;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    broker_->Stop();
    broker_->Start();
    settle.join();
    auto seen = shipping.seen();
    for (int i = 0; i < 12; i += 4) {
      EXPECT_GE(seen[records[i].key + "-shipping"].deliveries, 2) << records[i].key;
    }
    consumer_connections = shipping.connections();
  }
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM shipments WHERE status = 'created'"),
            11);
  long long publishes = Count(stack->DatabaseUrl("orchestrator"),
                              "SELECT coalesce(sum(publishes), 0) FROM saga_step_replies");
  ExpectClean(*stack, records, "step_queue_restart",
              "killed_before_ack=3 broker_restarts=1 publishes=" + std::to_string(publishes) +
                  " consumer_connections=" + std::to_string(consumer_connections));
}

// The stock shipping participant consumes its own queue (idemsaga shipping --amqp-url, as
// docs/messaging.md has it), and is killed -9 while runs wait for its replies: its command in
// hand is redelivered to the restarted process, whose guard replays. One shipment each.
TEST_F(StepQueue, TheStockShippingParticipantConsumesItsQueueAndIsKilledMidStep) {
  setenv("IDEMSAGA_SHIPPING_AMQP_URL", broker_->Url().c_str(), 1);
  setenv("IDEMSAGA_SHIPPING_AMQP_QUEUE", "shipping_stock", 1);
  auto stack = Started("stock", 2000);
  stack->SetFaults("shipping", {{"latency_ms", 300}});
  auto records = Runs("stock", 12, {2, 9});
  chaos::Driver driver({stack->OrchestratorUrl(0)});
  std::thread settle([&] { chaos::Settle(driver, records, std::chrono::seconds(120)); });
  const auto orch = stack->DatabaseUrl("orchestrator");
  // Once commands wait for the participant (each answer 300 ms late, so that its consumers
  // have one in hand); on this thread, which the participant's process dies with.
  long long unanswered = 0;
  for (auto until = Clock::now() + std::chrono::seconds(30); Clock::now() < until;) {
    unanswered = Count(orch, "SELECT count(*) FROM saga_step_replies WHERE reply_status IS NULL");
    if (unanswered >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stack->RestartParticipant("shipping");
  // What the restarted participant was handed again (printed: whether a command was in hand at
  // the kill is up to timing; QueueShipping's scenario kills one there for sure).
  long long redelivered = 0;
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    auto page = httplib::Client(stack->ParticipantUrl("shipping")).Get("/metrics");
    std::istringstream lines(page ? page->body : "");
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("idemsaga_amqp_commands_total{", 0) == 0 &&
          line.find("outcome=\"redelivered\"") != std::string::npos) {
        redelivered = std::stoll(line.substr(line.rfind(' ') + 1));
      }
    }
    if (redelivered > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  settle.join();
  unsetenv("IDEMSAGA_SHIPPING_AMQP_URL");
  unsetenv("IDEMSAGA_SHIPPING_AMQP_QUEUE");
  for (const auto& r : records) {
    bool refused = r.key == "stock-2" || r.key == "stock-9";
    EXPECT_EQ(r.final_status, refused ? 422 : 201) << r.key << " " << r.final_body;
  }
  EXPECT_EQ(Count(orch,
                  "SELECT count(*) FROM saga_step_replies WHERE derived_key LIKE "
                  "'%-shipping' AND reply_status IS NOT NULL"),
            12);
  EXPECT_EQ(Count(stack->DatabaseUrl("shipping"),
                  "SELECT count(*) FROM shipments WHERE status = 'created'"),
            10);
  long long publishes = Count(orch, "SELECT coalesce(sum(publishes), 0) FROM saga_step_replies");
  long long replies = Count(orch, "SELECT coalesce(sum(replies), 0) FROM saga_step_replies");
  ExpectClean(*stack, records, "step_queue_stock_shipping",
              "participant_kills=1 unanswered_at_kill=" + std::to_string(unanswered) +
                  " redelivered_after_kill=" + std::to_string(redelivered) + " publishes=" +
                  std::to_string(publishes) + " replies=" + std::to_string(replies));
}

}  // namespace
