// The AMQP intake on a three-node RabbitMQ cluster (rabbitmq-server from Debian, nodes of the
// test's own joined with rabbitmqctl) with quorum queues: under a steady load of orders (a
// share of them published twice), kill -9 a node the consumers are not connected to, restart
// it, then kill -9 the node they are connected to (which leads the queue) while each has a
// message in hand, and restart it. No message is lost (every one is answered), no order runs
// twice (the fault suite's invariants over the four databases, `idemsaga reconcile`
// included), every reply of a key is the same bytes, and the consumers are back, on a live
// node.
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/log.hpp"
#include "common/pg/cluster.hpp"
#include "common/amqp/connection.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/rabbitmq_broker.hpp"
#include "tests/support/metrics_text.hpp"

namespace {

using chaos::KeyRecord;
using chaos::Stack;
using idemsaga::common::amqp::AmqpError;
using idemsaga::common::amqp::Connection;
using idemsaga::common::amqp::Message;
using idemsaga::common::amqp::QueueType;
using Clock = std::chrono::steady_clock;

constexpr const char* kQueue = "orders_cluster";
constexpr const char* kReplies = "replies_cluster";
constexpr int kConsumers = 4;
// One order every kPace; every kCopyEvery-th is published twice (a client's duplicate).
constexpr auto kPace = std::chrono::milliseconds(60);
constexpr int kCopyEvery = 5;

long long Ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

struct Reply {
  int status = 0;
  std::string body;
  Clock::time_point at;
};

// A client of the cluster: a connection to one of its nodes, made again to the next node when
// it breaks (as the intake's consumers do). Lives on one thread.
class ClusterClient {
 public:
  explicit ClusterClient(std::vector<std::string> urls) : urls_(std::move(urls)) {}

  // `op` on a live connection, retried on the next node until it succeeds or `deadline`.
  template <class Op>
  bool Do(Op op, Clock::time_point deadline) {
    while (Clock::now() < deadline) {
      try {
        if (!conn_) Connect();
        op(*conn_);
        return true;
      } catch (const AmqpError&) {
        conn_.reset();
        ++failures_;
        node_ = (node_ + 1) % urls_.size();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    return false;
  }
  int failures() const { return failures_; }
  std::function<void(Connection&)> on_connect;

 private:
  void Connect() {
    conn_ = std::make_unique<Connection>(urls_[node_]);
    if (on_connect) on_connect(*conn_);
  }

  std::vector<std::string> urls_;
  size_t node_ = 0;
  int failures_ = 0;
  std::unique_ptr<Connection> conn_;
};

class RabbitClusterIntake : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    idemsaga::common::SetLogEnabled(false);
    dir_ = idemsaga::common::pg::PrivateCluster::MakeTempDir().string();
    auto started = Clock::now();
    cluster_ = new chaos::RabbitCluster(dir_ + "/rabbit");
    std::cout << "rabbit_cluster: three nodes started and joined in " << Ms(Clock::now() - started)
              << " ms" << std::endl;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    if (::testing::UnitTest::GetInstance()->current_test_suite()->Passed()) {
      std::filesystem::remove_all(dir_);
    }
  }

  // The consumers of `queue`, counted by the node their channel lives on (the node their
  // connection is to).
  static std::map<int, int> ConsumersByNode(const std::string& queue) {
    std::map<int, int> by_node;
    // Tab-separated: the JSON formatter prints a pid without its node's name.
    std::istringstream listed(
        cluster_->Ctl({"list_consumers", "queue_name", "channel_pid", "--no-table-headers"}));
    for (std::string line; std::getline(listed, line);) {
      auto tab = line.find('\t');
      if (tab == std::string::npos || line.substr(0, tab) != queue) continue;
      int node = cluster_->NodeOf(line.substr(tab + 1));
      EXPECT_GE(node, 0) << "a consumer on no node of the cluster: " << line;
      by_node[node]++;
    }
    return by_node;
  }

  // Waits until `queue` has `count` consumers on live nodes, and none on node `not_on` once it
  // runs (a quorum queue keeps listing the consumers of a node that went down, suspected down,
  // until that node is back and their channels are known to be gone). Returns them by node.
  static std::map<int, int> AwaitConsumers(const std::string& queue, int count, int not_on = -1) {
    std::map<int, int> by_node;
    for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
      by_node = ConsumersByNode(queue);
      int live = 0;
      for (const auto& [node, n] : by_node) live += node != not_on ? n : 0;
      bool stale = not_on >= 0 && cluster_->node(not_on).running() && by_node.count(not_on) > 0;
      if (live == count && !stale) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    if (not_on >= 0 && !cluster_->node(not_on).running()) by_node.erase(not_on);
    return by_node;
  }

  // The quorum queue `queue` as rabbitmqctl lists it: its type, its members, and those online.
  static nlohmann::json QueueInfo(const std::string& queue) {
    auto listed = nlohmann::json::parse(cluster_->Ctl(
        {"list_queues", "name", "type", "members", "online", "leader", "--formatter", "json"}));
    for (const auto& q : listed) {
      if (q.value("name", "") == queue) return q;
    }
    return nlohmann::json();
  }

  // Waits until every node is an online member of `queue` again (a restarted node has caught
  // up), so that losing another one leaves a majority.
  static bool AllOnline(const std::string& queue) {
    for (auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
      auto q = QueueInfo(queue);
      if (q.is_object() && q["online"].size() == static_cast<size_t>(cluster_->size())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return false;
  }

  static std::string dir_;
  static chaos::RabbitCluster* cluster_;
};

std::string RabbitClusterIntake::dir_;
chaos::RabbitCluster* RabbitClusterIntake::cluster_ = nullptr;

double Metric(const Stack& stack, const std::string& series) {
  httplib::Client c(stack.OrchestratorUrl(0));
  auto page = c.Get("/metrics");
  return page && page->status == 200 ? test_support::Sample(page->body, series) : -1;
}

TEST_F(RabbitClusterIntake, KillingANodeThenTheConsumersNodeUnderLoadLosesNoOrderAndRunsNoneTwice) {
  auto urls = cluster_->Urls();
  std::string url_list;
  for (const auto& u : urls) url_list += (url_list.empty() ? "" : ",") + u;
  chaos::StackOptions o;
  o.orchestrator_args = {
      "--amqp-url",        url_list, "--amqp-queue",     kQueue,
      "--amqp-queue-type", "quorum", "--amqp-consumers", std::to_string(kConsumers)};
  Stack stack("rabbit_cluster", o);
  stack.StartParticipants();
  // The replies queue is the client's: a quorum one too, or a reply on a dead node is lost.
  {
    Connection c(urls[0]);
    c.DeclareQueue(kReplies, QueueType::kQuorum);
  }
  stack.StartOrchestrator(0);
  // Every consumer on the first node given, and the queues the intake declared are quorum
  // queues replicated on all three nodes.
  auto consumers = AwaitConsumers(kQueue, kConsumers);
  ASSERT_EQ(consumers, (std::map<int, int>{{0, kConsumers}})) << "consumers by node";
  const std::string queue = kQueue;
  for (const auto& q : {queue, queue + ".dead", queue + ".events", queue + ".events.dead"}) {
    auto info = QueueInfo(q);
    ASSERT_TRUE(info.is_object()) << q << " not declared";
    EXPECT_EQ(info["type"], "quorum") << q;
    EXPECT_EQ(info["members"].size(), 3u) << q << ": " << info.dump();
  }

  // The load: orders at a steady pace from a publisher with confirms that sends a message
  // again (to the next node) when its confirm did not come; replies taken off the replies
  // queue (acked once recorded) with the time they came.
  std::vector<KeyRecord> records;
  std::mutex mutex;  // records (appended by the publisher) and replies
  std::map<std::string, std::vector<Reply>> replies;  // by correlation id "<i>/<copy>"
  std::set<std::string> published;
  std::atomic<bool> stop_publishing{false}, stop_collecting{false};
  std::atomic<int> republished{0};
  std::thread publisher([&] {
    ClusterClient client(urls);
    client.on_connect = [](Connection& c) { c.Confirm(); };
    for (int i = 0; !stop_publishing; ++i) {
      KeyRecord r{"demo", "cluster-" + std::to_string(i), chaos::OrderBody(i, i % 4 == 3)};
      {
        std::lock_guard lock(mutex);
        records.push_back(r);
      }
      for (int copy = 0; copy < (i % kCopyEvery == 0 ? 2 : 1); ++copy) {
        std::string id = std::to_string(i) + "/" + std::to_string(copy);
        Message m = chaos::AmqpOrder(r, kReplies, id);
        int before = client.failures();
        bool sent = client.Do([&](Connection& c) { c.Publish(kQueue, m); },
                              Clock::now() + std::chrono::seconds(60));
        republished += client.failures() - before;
        if (!sent) {
          ADD_FAILURE() << "no node took order " << id << " within 60 s";
          return;
        }
        std::lock_guard lock(mutex);
        published.insert(id);
      }
      std::this_thread::sleep_for(kPace);
    }
  });
  std::thread collector([&] {
    ClusterClient client({urls[1], urls[2], urls[0]});
    client.on_connect = [](Connection& c) {
      c.Prefetch(50);
      c.Consume(kReplies);
    };
    while (!stop_collecting) {
      client.Do(
          [&](Connection& c) {
            auto d = c.Next(std::chrono::milliseconds(200));
            if (!d) return;
            {
              std::lock_guard lock(mutex);
              replies[d->message.correlation_id].push_back(
                  {std::atoi(d->message.headers["status"].c_str()), d->message.body, Clock::now()});
            }
            c.Ack(d->tag);
          },
          Clock::now() + std::chrono::seconds(1));
    }
  });
  // However the test ends (a failed ASSERT included), the threads stop before their state goes.
  struct Joiner {
    std::vector<std::pair<std::atomic<bool>*, std::thread*>> threads;
    ~Joiner() {
      for (auto [stop, thread] : threads) {
        *stop = true;
        if (thread->joinable()) thread->join();
      }
    }
  } joiner{{{&stop_publishing, &publisher}, {&stop_collecting, &collector}}};
  auto replied = [&] {
    std::lock_guard lock(mutex);
    size_t n = 0;
    for (const auto& [id, rs] : replies) n += rs.size();
    return n;
  };
  // Until `more` replies came after now (or 60 s); the time to the first of them.
  auto await_replies = [&](size_t more) {
    auto from = Clock::now();
    size_t start = replied();
    while (replied() < start + more && Clock::now() < from + std::chrono::seconds(60)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return from;
  };
  auto first_reply_after = [&](Clock::time_point t) {
    std::lock_guard lock(mutex);
    auto first = Clock::time_point::max();
    for (const auto& [id, rs] : replies) {
      for (const auto& r : rs) {
        if (r.at > t) first = std::min(first, r.at);
      }
    }
    return first == Clock::time_point::max() ? -1 : Ms(first - t);
  };
  await_replies(30);

  // 1. A node no consumer is connected to: the last one.
  const int idle_node = cluster_->size() - 1;
  ASSERT_EQ(ConsumersByNode(kQueue).count(idle_node), 0u);
  auto kill1 = Clock::now();
  cluster_->node(idle_node).Kill();
  await_replies(30);
  cluster_->node(idle_node).Start();
  ASSERT_TRUE(AllOnline(kQueue)) << QueueInfo(kQueue).dump();
  await_replies(20);

  // 2. The node the consumers are connected to (the queue's leader: they declared it there).
  consumers = ConsumersByNode(kQueue);
  ASSERT_EQ(consumers.size(), 1u) << "consumers on more than one node";
  const int busy_node = consumers.begin()->first;
  ASSERT_GE(busy_node, 0);
  std::cout << "rabbit_cluster: leader of " << kQueue
            << " before the second kill: " << QueueInfo(kQueue).value("leader", "?") << std::endl;
  // Slow payments keep a message in every consumer's hand when its node dies.
  stack.SetFaults("payment", {{"latency_ms", 400}});
  await_replies(8);
  auto kill2 = Clock::now();
  cluster_->node(busy_node).Kill();
  consumers = AwaitConsumers(kQueue, kConsumers, busy_node);
  auto reconnected_ms = Ms(Clock::now() - kill2);
  stack.SetFaults("payment", {{"latency_ms", 0}});
  EXPECT_EQ(consumers.count(busy_node), 0u);
  int consumers_after = 0;
  for (const auto& [node, n] : consumers) consumers_after += n;
  EXPECT_EQ(consumers_after, kConsumers) << "every consumer connected again, to a live node";
  await_replies(30);
  cluster_->node(busy_node).Start();
  ASSERT_TRUE(AllOnline(kQueue)) << QueueInfo(kQueue).dump();
  EXPECT_EQ(AwaitConsumers(kQueue, kConsumers, busy_node).count(busy_node), 0u)
      << "the dead connections' consumers are gone once their node is back";
  await_replies(20);
  stop_publishing = true;
  publisher.join();

  // Every message answered (a message redelivered after its reply was published and before
  // its ack is answered twice).
  for (auto deadline = Clock::now() + std::chrono::seconds(90); Clock::now() < deadline;) {
    {
      std::lock_guard lock(mutex);
      if (std::all_of(published.begin(), published.end(),
                      [&](const std::string& id) { return replies.count(id) > 0; })) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_collecting = true;
  collector.join();

  int unanswered = 0, duplicate_replies = 0, differing = 0, messages = 0;
  for (const auto& id : published) {
    ++messages;
    auto it = replies.find(id);
    if (it == replies.end()) {
      ++unanswered;
      ADD_FAILURE() << "message " << id << " never answered";
      continue;
    }
    duplicate_replies += static_cast<int>(it->second.size()) - 1;
  }
  // Every reply for a key (its copies' and their redeliveries') the same status and bytes.
  std::map<size_t, std::vector<Reply>> by_key;
  for (const auto& [id, rs] : replies) {
    auto index = std::stoul(id.substr(0, id.find('/')));
    ASSERT_LT(index, records.size()) << id;
    by_key[index].insert(by_key[index].end(), rs.begin(), rs.end());
  }
  for (auto& [index, rs] : by_key) {
    auto& r = records[index];
    for (const auto& reply : rs) {
      if (reply.status != rs[0].status || reply.body != rs[0].body) ++differing;
      r.statuses[reply.status]++;
      if (reply.status >= 200 && reply.status < 300) r.acks.push_back(reply.body);
    }
    r.final = true;
    r.final_status = rs[0].status;
    r.final_body = rs[0].body;
  }
  EXPECT_EQ(differing, 0) << "replies of one key that differ";
  EXPECT_EQ(unanswered, 0);
  {
    Connection c(urls[0]);
    EXPECT_EQ(c.DeclareQueue(kQueue, QueueType::kQuorum), 0u) << "every message acknowledged";
    EXPECT_EQ(c.DeclareQueue(std::string(kQueue) + ".dead", QueueType::kQuorum), 0u);
  }
  double reconnects =
      Metric(stack, std::string("idemsaga_amqp_reconnects_total{queue=\"") + kQueue + "\"}");
  EXPECT_GE(reconnects, kConsumers) << "each consumer of the killed node connected again";
  // The messages in hand on the dead connections, handed out again.
  double redelivered = Metric(stack, "idemsaga_amqp_messages_total{outcome=\"redelivered\"}");
  EXPECT_GE(redelivered, 1) << "no message was in hand when the consumers' node died";

  auto report = chaos::CheckInvariants(stack, records);
  std::string line = report.Line(
      "rabbit_cluster",
      "messages=" + std::to_string(messages) + " replies=" + std::to_string(replied()) +
          " duplicate_replies=" + std::to_string(duplicate_replies) +
          " unanswered=" + std::to_string(unanswered) + " differing=" + std::to_string(differing) +
          " republished=" + std::to_string(republished.load()) +
          " kill_idle_node_to_reply_ms=" + std::to_string(first_reply_after(kill1)) +
          " kill_consumers_node_to_reply_ms=" + std::to_string(first_reply_after(kill2)) +
          " consumers_back_ms=" + std::to_string(reconnected_ms) +
          " reconnects=" + std::to_string(static_cast<long long>(reconnects)) +
          " redelivered=" + std::to_string(static_cast<long long>(std::max(redelivered, 0.0))));
  std::cout << line << std::endl;
  EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
  EXPECT_EQ(report.terminal, static_cast<long long>(records.size()));
}

}  // namespace
