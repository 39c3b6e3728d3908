// Orders and events from RabbitMQ (orchestrator --amqp-url): a real broker of the test's own,
// real `idemsaga` processes, and the fault suite's invariant checker over the four databases.
// Duplicated messages make one saga, a kill -9 between the claim and the ack makes one saga
// and still answers, a broker restart under load loses and doubles nothing, and messages the
// intake cannot take end in the dead-letter queue with their reason, storing nothing. An
// event for a waiting order, over the events queue or `idemsaga event`, is stored once and
// answered with the bytes the HTTP route replays.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <set>
#include <thread>

#include "common/amqp/connection.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/percent_encode.hpp"
#include "common/pg/cluster.hpp"
#include "common/process.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/rabbitmq_broker.hpp"
#include "tests/support/metrics_text.hpp"

namespace {

using chaos::KeyRecord;
using chaos::OrderBody;
using chaos::Stack;
using idemsaga::common::amqp::Connection;
using idemsaga::common::amqp::Message;
using Clock = std::chrono::steady_clock;

constexpr auto kSettle = std::chrono::seconds(90);

struct Reply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;
};

class AmqpIntake : public chaos::BrokerSuite {
 protected:
  // A stack whose orchestrator consumes orders_NAME (and answers on HTTP as ever), started
  // with `crash_points` (IDEMSAGA_CRASH_POINTS).
  static std::unique_ptr<Stack> Started(const std::string& name,
                                        const std::vector<std::string>& more_args = {},
                                        const std::string& crash_points = "") {
    chaos::StackOptions o;
    o.orchestrator_args = {"--amqp-url",     broker_->Url(),     "--amqp-queue",
                           "orders_" + name, "--amqp-consumers", "4"};
    o.orchestrator_args.insert(o.orchestrator_args.end(), more_args.begin(), more_args.end());
    auto stack = std::make_unique<Stack>("amqp_" + name, o);
    stack->StartParticipants();
    stack->StartOrchestrator(0, crash_points);
    return stack;
  }

  // Replies on `queue` by correlation id, until `want` of them or the settle bound.
  static std::map<std::string, std::vector<Reply>> Collect(Connection& c, const std::string& queue,
                                                           size_t want) {
    std::map<std::string, std::vector<Reply>> out;
    size_t got = 0;
    auto deadline = Clock::now() + kSettle;
    while (got < want && Clock::now() < deadline) {
      auto m = c.Get(queue);
      if (!m) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      Reply r{std::atoi(m->headers["status"].c_str()), m->body, m->headers};
      out[m->correlation_id].push_back(r);
      ++got;
    }
    return out;
  }

  // Each record's final answer from its replies: the first; every 2xx among them is an ack.
  static void Record(KeyRecord& r, const std::vector<Reply>& replies) {
    for (const auto& reply : replies) {
      r.statuses[reply.status]++;
      if (reply.status >= 200 && reply.status < 300) r.acks.push_back(reply.body);
      if (!r.final) {
        r.final = true;
        r.final_status = reply.status;
        r.final_body = reply.body;
      }
    }
  }

  // An event message for the run of place_order under `run` (the run key's raw bytes): the
  // event's own key as an sf-string header, the tenant's API key, a reply queue.
  static Message Event(const std::string& tenant, const std::string& run, const std::string& name,
                       const std::string& event_key, const std::string& payload,
                       const std::string& reply_to, const std::string& correlation_id) {
    Message m;
    m.headers["saga"] = "place_order";
    m.headers["run"] = run;
    m.headers["event"] = name;
    m.headers["Idempotency-Key"] = idemsaga::common::FormatIdempotencyKey(event_key);
    m.headers["Authorization"] = "Bearer dev-key-" + tenant;
    m.content_type = "application/json";
    m.reply_to = reply_to;
    m.correlation_id = correlation_id;
    m.body = payload;
    return m;
  }

  // A publisher with confirms, once orders_NAME, its events queue and replies_NAME exist.
  static std::unique_ptr<Connection> Publisher(const std::string& name) {
    auto c = std::make_unique<Connection>(broker_->Url());
    c->DeclareQueue("orders_" + name);
    c->DeclareQueue("orders_" + name + ".events");
    c->DeclareQueue("replies_" + name);
    c->Confirm();
    return c;
  }

  // `sql`'s one number, with $1 = `param` when given (keys with any printable byte).
  static long long Count(const std::string& url, const std::string& sql,
                         const std::optional<std::string>& param = std::nullopt) {
    pqxx::connection c(url);
    pqxx::nontransaction tx(c);
    return (param ? tx.exec_params(sql, *param) : tx.exec(sql))[0][0].as<long long>();
  }

  // Waits until the 3-D Secure charge of the order `key` is authorised, waiting for the card
  // holder: the order's saga is parked on payment_confirmed.
  static bool Parked(const Stack& stack, const std::string& key) {
    for (auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
      if (Count(stack.DatabaseUrl("payment"),
                "SELECT count(*) FROM charges WHERE idempotency_key = $1 || '-payment' "
                "AND status = 'requires_action'",
                key) == 1) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // The orchestrator's idemsaga_amqp_messages_total{outcome} (or `family`'s), once it reaches
  // `want` (it counts a message after its ack, a moment after its reply) or 10 s have passed;
  // promtool must accept the page.
  static double Messages(const Stack& stack, const std::string& outcome, double want,
                         const std::string& family = "idemsaga_amqp_messages_total") {
    httplib::Client c(stack.OrchestratorUrl(0));
    std::string series = family + "{outcome=\"" + outcome + "\"}";
    double seen = -1;
    std::string body;
    for (auto deadline = Clock::now() + std::chrono::seconds(10); Clock::now() < deadline;) {
      auto page = c.Get("/metrics");
      if (page && page->status == 200) {
        body = page->body;
        if ((seen = test_support::Sample(body, series)) == want) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(test_support::PromtoolProblems(body), "");
    return seen;
  }

  // The i-th order of `tenant` under `key`, paid by a card that needs 3-D Secure: its saga
  // parks waiting for payment_confirmed (or payment_failed).
  static KeyRecord ThreeDSecureOrder(const std::string& tenant, const std::string& key, int i) {
    auto body = nlohmann::json::parse(OrderBody(i, false));
    body["payment_method"] = "pm_card_3ds";
    return {tenant, key, body.dump()};
  }

  // A message the intake must refuse, and the problem code it must give.
  struct Poison {
    std::string name;
    Message message;
    std::string error;  // the problem code in the dead letter and the reply
  };

  // An Idempotency-Key header the routes refuse (i-th of four kinds): a control byte, too
  // long, a list, a parameter.
  static std::string GeneratedBadKey(int i, std::mt19937& rng) {
    switch (i % 4) {
      case 0:
        return idemsaga::common::FormatIdempotencyKey(
            "k" + std::string(1, static_cast<char>(rng() % 32)) + std::to_string(i));
      case 1:
        return idemsaga::common::FormatIdempotencyKey(
            std::string(201, static_cast<char>('a' + i % 26)));
      case 2:
        return "\"a" + std::to_string(i) + "\", \"b\"";
      default:
        return "\"a" + std::to_string(i) + "\";p=1";
    }
  }

  // Publishes `cases` to `queue` (correlation ids: their indexes) and checks that each is
  // answered once on `replies` with its error and dead-lettered once to `queue`.dead with its
  // reason, its body, and no tenant's API key; the queue is left empty. Returns how many were
  // answered with a 5xx.
  static int ExpectDeadLettered(Connection& c, const std::string& queue, const std::string& replies,
                                std::vector<Poison>& cases) {
    for (size_t i = 0; i < cases.size(); ++i) {
      cases[i].message.correlation_id = std::to_string(i);
      c.Publish(queue, cases[i].message);
    }
    auto answered = Collect(c, replies, cases.size());
    int server_errors = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& rs = answered[std::to_string(i)];
      EXPECT_EQ(rs.size(), 1u) << cases[i].name;
      if (rs.empty()) continue;
      server_errors += rs[0].status >= 500 ? 1 : 0;
      EXPECT_GE(rs[0].status, 400) << cases[i].name;
      EXPECT_NE(rs[0].body.find("\"" + cases[i].error + "\""), std::string::npos)
          << cases[i].name << ": " << rs[0].body;
    }
    std::map<std::string, Message> dead;
    for (auto m = c.Get(queue + ".dead"); m; m = c.Get(queue + ".dead")) {
      dead[m->correlation_id] = *m;
    }
    EXPECT_EQ(dead.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      auto it = dead.find(std::to_string(i));
      if (it == dead.end()) {
        ADD_FAILURE() << "not dead-lettered: " << cases[i].name;
        continue;
      }
      const auto& m = it->second;
      EXPECT_EQ(m.headers.at("x-idemsaga-error"), cases[i].error) << cases[i].name;
      EXPECT_FALSE(m.headers.at("x-idemsaga-detail").empty()) << cases[i].name;
      EXPECT_EQ(m.headers.count("Authorization"), 0u) << cases[i].name;
      EXPECT_EQ(m.body, cases[i].message.body) << cases[i].name;
    }
    EXPECT_EQ(c.DeclareQueue(queue), 0u);
    return server_errors;
  }
};

// The fault suite's invariants over the four databases, every record's saga ended.
void ExpectClean(const Stack& stack, const std::vector<KeyRecord>& records,
                 const std::string& scenario, const std::string& extra = "") {
  auto report = chaos::CheckInvariants(stack, records);
  std::string line = report.Line(scenario, extra);
  std::cout << line << std::endl;
  EXPECT_TRUE(report.Clean()) << line << "\nreconcile: " << report.reconcile_report;
  EXPECT_EQ(report.terminal, static_cast<long long>(records.size()));
}

TEST_F(AmqpIntake, FiftyCopiesOfAMessageMakeOneSagaAndFiftyIdenticalReplies) {
  auto started = Started("copies");
  Stack& stack = *started;
  auto publisher = Publisher("copies");
  Connection& c = *publisher;
  // One key sent 50 times, beside 10 other orders (every fourth declined).
  std::vector<KeyRecord> records;
  for (int i = 0; i < 11; ++i)
    records.push_back({"demo", "amqp-copies-" + std::to_string(i), OrderBody(i, i % 4 == 3)});
  constexpr int kCopies = 50;
  for (int d = 0; d < kCopies; ++d) {
    c.Publish("orders_copies",
              chaos::AmqpOrder(records[0], "replies_copies", "0/" + std::to_string(d)));
  }
  for (size_t i = 1; i < records.size(); ++i) {
    c.Publish("orders_copies", chaos::AmqpOrder(records[i], "replies_copies", std::to_string(i)));
  }
  auto replies = Collect(c, "replies_copies", kCopies + records.size() - 1);
  std::set<std::string> bodies;
  int copies_answered = 0;
  for (const auto& [id, rs] : replies) {
    size_t slash = id.find('/');
    size_t index = std::stoul(id.substr(0, slash));
    ASSERT_LT(index, records.size()) << id;
    EXPECT_EQ(rs.size(), 1u) << "one reply per message: " << id;
    Record(records[index], rs);
    if (index == 0) {
      ++copies_answered;
      for (const auto& r : rs) bodies.insert(std::to_string(r.status) + " " + r.body);
    }
  }
  EXPECT_EQ(copies_answered, kCopies);
  EXPECT_EQ(bodies.size(), 1u) << "every copy is answered with the same bytes";
  EXPECT_EQ(c.DeclareQueue("orders_copies"), 0u) << "every message acknowledged";
  EXPECT_EQ(c.DeclareQueue("orders_copies.dead"), 0u);
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"), "SELECT count(*) FROM idempotency_keys"),
            static_cast<long long>(records.size()));
  // The same key over HTTP is the same order: its stored answer, replayed.
  chaos::Driver http({stack.OrchestratorUrl(0)});
  KeyRecord over_http{"demo", records[0].key, records[0].body};
  ASSERT_TRUE(http.Attempt(over_http, 0));
  EXPECT_EQ(over_http.final_body, records[0].final_body);
  EXPECT_EQ(over_http.final_status, records[0].final_status);
  EXPECT_EQ(Messages(stack, "replied", kCopies + 10), kCopies + 10);
  ExpectClean(stack, records, "amqp_copies",
              "messages=" + std::to_string(kCopies + 10) +
                  " replies_for_copied_key=" + std::to_string(copies_answered));
}

// A message names any served saga in its header `saga`: the same run as POST /v1/runs/{saga}
// with its key, answered with the same bytes either way; a saga not served here is refused
// (404 saga_not_found, dead-lettered) and stores nothing.
TEST_F(AmqpIntake, AMessageStartsTheSagaItsSagaHeaderNamesAsTheRunsRouteWould) {
  auto started = Started("runs");
  Stack& stack = *started;
  auto publisher = Publisher("runs");
  Connection& c = *publisher;
  std::vector<KeyRecord> records;
  for (int i = 0; i < 6; ++i) {
    records.push_back({"demo", "amqp-runs-" + std::to_string(i), OrderBody(i, i % 3 == 2),
                       chaos::kPlaceOrderParallel});
  }
  for (size_t i = 0; i < records.size(); ++i) {
    auto m = chaos::AmqpOrder(records[i], "replies_runs", std::to_string(i));
    m.headers["saga"] = chaos::kPlaceOrderParallel;
    c.Publish("orders_runs", m);
  }
  auto replies = Collect(c, "replies_runs", records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& rs = replies[std::to_string(i)];
    ASSERT_EQ(rs.size(), 1u) << records[i].key;
    Record(records[i], rs);
    EXPECT_EQ(records[i].final_status, i % 3 == 2 ? 402 : 201) << records[i].final_body;
  }
  chaos::Driver http({stack.OrchestratorUrl(0)});
  for (const auto& r : records) {
    KeyRecord again{r.tenant, r.key, r.body, r.saga};
    ASSERT_TRUE(http.Attempt(again, 0));
    EXPECT_EQ(again.final_status, r.final_status) << r.key;
    EXPECT_EQ(again.final_body, r.final_body) << r.key;
  }
  std::vector<Poison> unknown;
  for (const char* saga : {"no_such_saga", "Place_Order", "place_order/x", ""}) {
    KeyRecord r{"demo", std::string("amqp-runs-unknown-") + saga, OrderBody(0, false)};
    auto m = chaos::AmqpOrder(r, "replies_runs", "");
    m.headers["saga"] = saga;
    unknown.push_back({std::string("saga=") + saga, m,
                       std::string(saga).empty() ? "invalid_request" : "saga_not_found"});
  }
  EXPECT_EQ(ExpectDeadLettered(c, "orders_runs", "replies_runs", unknown), 0);
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"), "SELECT count(*) FROM idempotency_keys"),
            static_cast<long long>(records.size()));
  ExpectClean(stack, records, "amqp_runs");
}

TEST_F(AmqpIntake, KillNineBetweenClaimAndAckRedeliversAndMakesOneSaga) {
  // The first claim kills the process: the key is claimed, the message not acknowledged.
  auto started = Started("kill", {}, "after_claim");
  Stack& stack = *started;
  auto publisher = Publisher("kill");
  Connection& c = *publisher;
  std::vector<KeyRecord> records = {{"demo", "amqp-kill-0", OrderBody(0, false)},
                                    {"demo", "amqp-kill-1", OrderBody(1, true)}};
  c.Publish("orders_kill", chaos::AmqpOrder(records[0], "replies_kill", "0"));
  ASSERT_TRUE(stack.orchestrator(0).Exited(std::chrono::seconds(30)))
      << "the orchestrator did not reach its crash point";
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"),
                  "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'amqp-kill-0'"),
            1)
      << "claimed before the crash";
  EXPECT_EQ(Count(stack.DatabaseUrl("payment"), "SELECT count(*) FROM charges"), 0);
  stack.StartOrchestrator(0);
  c.Publish("orders_kill", chaos::AmqpOrder(records[1], "replies_kill", "1"));
  auto replies = Collect(c, "replies_kill", 2);
  for (size_t i = 0; i < records.size(); ++i) Record(records[i], replies[std::to_string(i)]);
  EXPECT_EQ(records[0].final_status, 201) << records[0].final_body;
  EXPECT_EQ(replies["0"].size(), 1u);
  EXPECT_EQ(c.DeclareQueue("orders_kill"), 0u);
  ExpectClean(stack, records, "amqp_kill_between_claim_and_ack");
}

TEST_F(AmqpIntake, BrokerRestartUnderLoadEndsEveryOrderOnce) {
  auto started = Started("restart");
  Stack& stack = *started;
  Publisher("restart");
  constexpr int kOrders = 80, kRestartAt = 30;
  std::vector<KeyRecord> records;
  for (int i = 0; i < kOrders; ++i) {
    records.push_back({"demo", "amqp-restart-" + std::to_string(i), OrderBody(i, i % 4 == 3)});
  }
  // A publisher that sends each order until the broker confirms it, reconnecting as needed:
  // an order whose confirm was lost is sent again, under its key.
  std::unique_ptr<Connection> pub;
  int republished = 0;
  for (int i = 0; i < kOrders; ++i) {
    if (i == kRestartAt) {
      broker_->Stop();
      broker_->Start();
    }
    for (int attempt = 0;; ++attempt) {
      try {
        if (!pub) {
          pub = std::make_unique<Connection>(broker_->Url());
          pub->Confirm();
        }
        pub->Publish("orders_restart",
                     chaos::AmqpOrder(records[i], "replies_restart", std::to_string(i)));
        break;
      } catch (const idemsaga::common::amqp::AmqpError&) {
        pub.reset();
        ++republished;
        ASSERT_LT(attempt, 50) << "the broker did not come back";
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }
  pub.reset();
  // Replies until every order has one (a message redelivered after the restart may answer
  // twice, with the same bytes).
  Connection c(broker_->Url());
  std::map<std::string, std::vector<Reply>> replies;
  auto deadline = Clock::now() + kSettle;
  while (replies.size() < static_cast<size_t>(kOrders) && Clock::now() < deadline) {
    for (auto& [id, rs] : Collect(c, "replies_restart", 1)) {
      replies[id].insert(replies[id].end(), rs.begin(), rs.end());
    }
  }
  int duplicate_replies = 0;
  for (auto& [id, rs] : replies) {
    Record(records[std::stoul(id)], rs);
    duplicate_replies += static_cast<int>(rs.size()) - 1;
    for (const auto& r : rs) EXPECT_EQ(r.body, rs[0].body) << "replies of " << id << " differ";
  }
  EXPECT_EQ(replies.size(), static_cast<size_t>(kOrders));
  ExpectClean(stack, records, "amqp_broker_restart",
              "republished=" + std::to_string(republished) +
                  " duplicate_replies=" + std::to_string(duplicate_replies));
}

TEST_F(AmqpIntake, MessagesItCannotTakeAreDeadLetteredWithTheirReasonAndStoreNothing) {
  auto started = Started("poison");
  Stack& stack = *started;
  auto publisher = Publisher("poison");
  Connection& c = *publisher;
  KeyRecord good{"demo", "amqp-poison-good", OrderBody(1, false)};
  c.Publish("orders_poison", chaos::AmqpOrder(good, "replies_poison", "good"));
  ASSERT_EQ(Collect(c, "replies_poison", 1)["good"].size(), 1u);

  std::vector<Poison> cases;
  auto base = [&](const std::string& key) {
    return chaos::AmqpOrder({"demo", key, OrderBody(2, false)}, "replies_poison", "");
  };
  {
    Message m = base("amqp-poison-json");
    m.body = "{\"customer_id\": ";
    cases.push_back({"bad JSON", m, "invalid_json"});
  }
  {
    Message m = base("unused");
    m.headers.erase("Idempotency-Key");
    cases.push_back({"no key and no message id", m, "idempotency_key_missing"});
  }
  {
    Message m = base("amqp-poison-tenant");
    m.headers["Authorization"] = "Bearer not-a-tenant";
    cases.push_back({"unknown tenant", m, "unauthorized"});
  }
  {
    Message m = base("amqp-poison-items");
    m.body = R"({"customer_id":"c","amount_cents":1,"currency":"USD","payment_method":"pm"})";
    cases.push_back({"an order without items", m, "invalid_request"});
  }
  {
    Message m = base("amqp-poison-good");  // the good order's key, another body
    cases.push_back({"a key reused for another order", m, "idempotency_key_reused"});
  }
  {
    Message m = base("amqp-poison-type");
    m.content_type = "text/plain";
    cases.push_back({"not JSON by its content type", m, "unsupported_media_type"});
  }
  // Generated keys the route refuses: control bytes, too long, lists and parameters.
  std::mt19937 rng(14);
  for (int i = 0; i < 200; ++i) {
    Message m = base("x");
    m.headers["Idempotency-Key"] = GeneratedBadKey(i, rng);
    cases.push_back({"generated key " + std::to_string(i), m, "idempotency_key_invalid"});
  }
  int server_errors = ExpectDeadLettered(c, "orders_poison", "replies_poison", cases);
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(Messages(stack, "dead_lettered", cases.size()), static_cast<double>(cases.size()));
  EXPECT_EQ(Messages(stack, "replied", 1), 1);
  // Nothing stored but the good order.
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"), "SELECT count(*) FROM idempotency_keys"), 1);
  EXPECT_EQ(Count(stack.DatabaseUrl("inventory"), "SELECT count(*) FROM reservations"), 1);
  EXPECT_EQ(Count(stack.DatabaseUrl("payment"), "SELECT count(*) FROM charges"), 1);
  std::cout << "amqp_poison: messages=" << cases.size() << " dead_lettered=" << cases.size()
            << " status_5xx=" << server_errors << std::endl;
}

TEST_F(AmqpIntake, AStoredFailureIsFinalWhateverItsStatus) {
  // Payment stays down past the step's deadline: the saga compensates and stores 502. Before
  // the fix, that 502 was requeued on every delivery, for ever.
  auto started = Started("failure", {"--step-deadline-ms", "1500"});
  Stack& stack = *started;
  stack.SetFaults("payment", {{"error_rate", 1.0}});
  auto publisher = Publisher("failure");
  Connection& c = *publisher;
  std::vector<KeyRecord> records = {{"demo", "amqp-failure-0", OrderBody(0, false)}};
  c.Publish("orders_failure", chaos::AmqpOrder(records[0], "replies_failure", "0"));
  c.Publish("orders_failure", chaos::AmqpOrder(records[0], "replies_failure", "0"));  // and a copy
  // Back once the step has failed, so that its compensation (a refund of nothing) goes through.
  const std::string status_sql =
      "SELECT count(*) FROM idempotency_keys WHERE status = 'compensating'";
  for (auto deadline = Clock::now() + std::chrono::seconds(30);
       Count(stack.DatabaseUrl("orchestrator"), status_sql) == 0 && Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stack.SetFaults("payment", {{"error_rate", 0.0}});
  auto replies = Collect(c, "replies_failure", 2);
  Record(records[0], replies["0"]);
  ASSERT_EQ(replies["0"].size(), 2u);
  EXPECT_EQ(replies["0"][0].status, 502) << replies["0"][0].body;
  EXPECT_EQ(replies["0"][1].body, replies["0"][0].body);
  EXPECT_EQ(Messages(stack, "replied", 2), 2);
  EXPECT_EQ(Messages(stack, "requeued", 0), -1) << "never requeued";
  ExpectClean(stack, records, "amqp_stored_failure");
}

TEST_F(AmqpIntake, QueuesDeletedUnderItAreDeclaredAgainAndNothingIsLost) {
  auto started = Started("deleted");
  Stack& stack = *started;
  auto publisher = Publisher("deleted");
  Connection& c = *publisher;
  std::vector<KeyRecord> records = {{"demo", "amqp-deleted-0", OrderBody(0, false)},
                                    {"demo", "amqp-deleted-1", OrderBody(1, false)}};
  c.Publish("orders_deleted", chaos::AmqpOrder(records[0], "replies_deleted", "0"));
  auto first = Collect(c, "replies_deleted", 1);
  ASSERT_EQ(first["0"].size(), 1u);
  Record(records[0], first["0"]);
  // The broker cancels every consumer of a deleted queue; the dead-letter queue goes too.
  c.DeleteQueue("orders_deleted");
  c.DeleteQueue("orders_deleted.dead");
  c.DeclareQueue("orders_deleted");
  Message poison = chaos::AmqpOrder({"demo", "amqp-deleted-bad", "{"}, "replies_deleted", "bad");
  c.Publish("orders_deleted", poison);
  c.Publish("orders_deleted", chaos::AmqpOrder(records[1], "replies_deleted", "1"));
  auto replies = Collect(c, "replies_deleted", 2);
  Record(records[1], replies["1"]);
  EXPECT_EQ(replies["1"].size(), 1u) << "consumed again after the cancel";
  EXPECT_EQ(replies["bad"].size(), 1u);
  std::optional<Message> dead;
  for (auto deadline = Clock::now() + std::chrono::seconds(30); !dead && Clock::now() < deadline;) {
    try {
      Connection probe(broker_->Url());
      dead = probe.Get("orders_deleted.dead");
    } catch (const idemsaga::common::amqp::AmqpError&) {  // not declared again yet
    }
    if (!dead) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(dead) << "the dead letter was lost";
  EXPECT_EQ(dead->correlation_id, "bad");
  EXPECT_EQ(dead->headers["x-idemsaga-error"], "invalid_json");
  ExpectClean(stack, records, "amqp_queues_deleted");
}

// A place_order run paid by a card that needs 3-D Secure, ordered over the queue under a key
// with every awkward byte a path has (space, `/`, `%2F` as text, quotes), parks waiting for
// payment_confirmed; the event comes over the events queue, 50 copies of one message.
TEST_F(AmqpIntake, AnEventMessageCompletesAWaitingOrderAndFiftyCopiesAreStoredOnce) {
  auto started = Started("events");
  Stack& stack = *started;
  auto publisher = Publisher("events");
  Connection& c = *publisher;
  const std::string key = R"(amqp events/1 %2F "q")";
  std::vector<KeyRecord> records = {ThreeDSecureOrder("demo", key, 0)};
  c.Publish("orders_events", chaos::AmqpOrder(records[0], "replies_events", "order"));
  ASSERT_TRUE(Parked(stack, key)) << "the order did not park on its confirmation";

  constexpr int kCopies = 50;
  const std::string event_key = "amqp-events-confirmed";
  for (int i = 0; i < kCopies; ++i) {
    c.Publish("orders_events.events", Event("demo", key, "payment_confirmed", event_key, "{}",
                                            "replies_events", "event/" + std::to_string(i)));
  }
  // Every copy answered, and the order (whose message waited in hand) answered once it ended.
  auto replies = Collect(c, "replies_events", kCopies + 1);
  std::set<std::string> answers;
  int copies = 0;
  for (const auto& [id, rs] : replies) {
    if (id == "order") continue;
    ASSERT_EQ(rs.size(), 1u) << "one reply per message: " << id;
    ++copies;
    answers.insert(std::to_string(rs[0].status) + " " + rs[0].body);
  }
  EXPECT_EQ(copies, kCopies);
  ASSERT_EQ(answers.size(), 1u) << "every copy is answered with the same bytes";
  const Reply& event_reply = replies["event/0"][0];
  EXPECT_EQ(event_reply.status, 202) << event_reply.body;
  EXPECT_EQ(nlohmann::json::parse(event_reply.body)["event_idempotency_key"], event_key);
  Record(records[0], replies["order"]);
  EXPECT_EQ(records[0].final_status, 201) << records[0].final_body;

  // One delivery stored; the charge captured once, by one capture call.
  const std::string orch = stack.DatabaseUrl("orchestrator");
  EXPECT_EQ(Count(orch, "SELECT count(*) FROM saga_events"), 1);
  EXPECT_EQ(Count(orch, "SELECT count(*) FROM saga_events WHERE idempotency_key = $1", key), 1);
  EXPECT_EQ(Count(stack.DatabaseUrl("payment"),
                  "SELECT count(*) FROM charges WHERE idempotency_key = $1 || '-payment' "
                  "AND status = 'captured'",
                  key),
            1);
  EXPECT_EQ(
      Count(stack.DatabaseUrl("payment"),
            "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1 || '-capture'", key),
      1);
  // The same event key over HTTP replays the queue's answer byte for byte.
  httplib::Client http(stack.OrchestratorUrl(0));
  auto replay = http.Post(
      "/v1/runs/place_order/" + idemsaga::common::PercentEncode(key) + "/events/payment_confirmed",
      {{"Authorization", "Bearer dev-key-demo"},
       {"Idempotency-Key", idemsaga::common::FormatIdempotencyKey(event_key)}},
      "{}", "application/json");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, event_reply.status);
  EXPECT_EQ(replay->body, event_reply.body);
  // (httplib's client decodes a Location it reads: the reply's is compared with the path.)
  EXPECT_EQ(event_reply.headers.at("Location"),
            "/v1/orders/" + idemsaga::common::PercentEncode(key));
  EXPECT_EQ(c.DeclareQueue("orders_events.events"), 0u) << "every message acknowledged";
  EXPECT_EQ(c.DeclareQueue("orders_events.events.dead"), 0u);
  EXPECT_EQ(Messages(stack, "replied", kCopies, "idemsaga_amqp_event_messages_total"), kCopies);
  ExpectClean(stack, records, "amqp_event_copies",
              "event_messages=" + std::to_string(kCopies) +
                  " distinct_replies=" + std::to_string(answers.size()));
}

TEST_F(AmqpIntake, EventMessagesItCannotTakeAreDeadLetteredWithTheirReasonAndStoreNothing) {
  auto started = Started("bad_events");
  Stack& stack = *started;
  auto publisher = Publisher("bad_events");
  Connection& c = *publisher;
  const std::string queue = "orders_bad_events.events", replies = "replies_bad_events";
  // Three runs: demo's and acme's waiting for a 3-D Secure confirmation, and demo's paid by a
  // card that needs none (its wait was skipped; it has ended).
  std::vector<KeyRecord> records = {ThreeDSecureOrder("demo", "bad-events-3ds", 0),
                                    ThreeDSecureOrder("acme", "bad-events-acme", 1),
                                    {"demo", "bad-events-visa", OrderBody(2, false)}};
  chaos::Driver driver({stack.OrchestratorUrl(0)});
  driver.UntilFinal(records[2], Clock::now() + kSettle);
  ASSERT_EQ(records[2].final_status, 201);
  for (int i = 0; i < 2; ++i) {
    driver.Attempt(records[i], 0);
    ASSERT_TRUE(Parked(stack, records[i].key)) << records[i].key;
  }
  // The one good delivery: acme confirms its own run.
  c.Publish(queue, Event("acme", "bad-events-acme", "payment_confirmed", "acme-ok", "{}", replies,
                         "good"));
  ASSERT_EQ(Collect(c, replies, 1)["good"].at(0).status, 202);

  std::vector<Poison> cases;
  auto base = [&](const std::string& event_key) {
    return Event("demo", "bad-events-3ds", "payment_confirmed", event_key, "{}", replies, "");
  };
  // One header set (added, when its name differs in case from the message's) or, without a
  // value, removed.
  struct HeaderCase {
    std::string name, header;
    std::optional<std::string> value;
    std::string error;
  };
  std::vector<HeaderCase> header_cases = {
      {"no key and no message id", "Idempotency-Key", std::nullopt, "idempotency_key_missing"},
      {"two keys", "idempotency-key", idemsaga::common::FormatIdempotencyKey("other"),
       "idempotency_key_invalid"},
      {"unknown tenant", "Authorization", "Bearer not-a-tenant", "unauthorized"},
      {"a run of another tenant", "run", "bad-events-acme", "not_found"},
      {"no run under this key", "run", "bad-events-nobody/%2F", "not_found"},
      {"an unknown saga", "saga", "no_such_saga", "not_found"},
      {"the run under another saga's name", "saga", "ship_order", "not_found"},
      {"an event the saga does not await", "event", "shipment_arrived", "event_not_expected"},
      {"an event name with a slash", "event", "payment_confirmed/../x", "event_not_expected"},
      {"a run that awaits nothing any more", "run", "bad-events-visa", "event_not_accepted"}};
  for (std::string target : {"saga", "run", "event"}) {
    std::string upper = target;
    for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    header_cases.push_back({"no " + target + " header", target, std::nullopt, "invalid_request"});
    header_cases.push_back({"an empty " + target + " header", target, "", "invalid_request"});
    header_cases.push_back(
        {"two " + target + " headers", upper, "bad-events-visa", "invalid_request"});
  }
  for (const auto& h : header_cases) {
    Message m = base("event key for: " + h.name);
    if (h.value) {
      m.headers[h.header] = *h.value;
    } else {
      m.headers.erase(h.header);
    }
    cases.push_back({h.name, m, h.error});
  }
  // Payloads the route refuses, and a stored event's key sent with another payload.
  for (auto [name, body, content_type, error] :
       {std::tuple{"a payload the saga refuses", R"({"amount": 5})", "application/json",
                   "invalid_request"},
        std::tuple{"a payload that is no object", "[]", "application/json", "invalid_request"},
        std::tuple{"a payload that is no JSON", "{\"reason\": ", "application/json",
                   "invalid_json"},
        std::tuple{"a payload of another content type", "{}", "text/plain",
                   "unsupported_media_type"}}) {
    Message m = base(std::string("event key for: ") + name);
    m.body = body;
    m.content_type = content_type;
    cases.push_back({name, m, error});
  }
  cases.push_back({"a stored event's key with another payload",
                   Event("acme", "bad-events-acme", "payment_confirmed", "acme-ok",
                         R"({"reason":"x"})", replies, ""),
                   "idempotency_key_reused"});
  // Generated run keys the route refuses (control and non-ASCII bytes, too long), and
  // event keys as the order test generates them.
  std::mt19937 rng(15);
  for (int i = 0; i < 120; ++i) {
    Message m = base("x");
    switch (i % 5) {
      case 0:
        m.headers["run"] = "k" + std::string(1, static_cast<char>(rng() % 32)) + std::to_string(i);
        break;
      case 1:
        m.headers["run"] = "k" + std::string(1, static_cast<char>(0x80 + rng() % 128));
        break;
      case 2:
        m.headers["run"] = std::string(201, static_cast<char>('a' + i % 26));
        break;
      default:
        m.headers["Idempotency-Key"] = GeneratedBadKey(i, rng);
    }
    cases.push_back({"generated key " + std::to_string(i), m, "idempotency_key_invalid"});
  }
  int server_errors = ExpectDeadLettered(c, queue, replies, cases);
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(Messages(stack, "dead_lettered", cases.size(), "idemsaga_amqp_event_messages_total"),
            static_cast<double>(cases.size()));
  // Nothing stored but acme's event; demo's run still waits, and takes its confirmation.
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"), "SELECT count(*) FROM saga_events"), 1);
  EXPECT_FALSE(stack.orchestrator(0).Exited(std::chrono::milliseconds(0)));
  c.Publish(queue,
            Event("demo", "bad-events-3ds", "payment_confirmed", "demo-ok", "{}", replies, "last"));
  ASSERT_EQ(Collect(c, replies, 1)["last"].at(0).status, 202);
  for (auto& r : records) driver.UntilFinal(r, Clock::now() + kSettle);
  EXPECT_EQ(records[0].final_status, 201) << records[0].final_body;
  EXPECT_EQ(records[1].final_status, 201) << records[1].final_body;
  ExpectClean(
      stack, records, "amqp_bad_events",
      "messages=" + std::to_string(cases.size()) + " status_5xx=" + std::to_string(server_errors));
}

// `idemsaga event` (the real binary) delivers the confirmation of a waiting order whose key
// needs percent-encoding in the path, and the events queue's copy of it replays that answer.
TEST_F(AmqpIntake, TheCliDeliversAnEventAndTheQueueReplaysItsAnswer) {
  auto started = Started("cli");
  Stack& stack = *started;
  auto publisher = Publisher("cli");
  Connection& c = *publisher;
  const std::string key = "cli order/1 %25?#";
  std::vector<KeyRecord> records = {ThreeDSecureOrder("demo", key, 0)};
  c.Publish("orders_cli", chaos::AmqpOrder(records[0], "replies_cli", "order"));
  ASSERT_TRUE(Parked(stack, key));

  std::string log = stack.log_dir() + "/cli_event.log";
  int exit = idemsaga::common::RunProgram(
      {IDEMSAGA_BINARY, "event", "--url", stack.OrchestratorUrl(0), "--api-key", "dev-key-demo",
       "--run", key, "--name", "payment_confirmed", "--key", "cli-confirmed"},
      log);
  std::ifstream in(log);
  std::string printed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(exit, 0) << printed;
  EXPECT_EQ(printed.rfind("HTTP 202\n", 0), 0u) << printed;
  EXPECT_NE(printed.find("Location: /v1/orders/"), std::string::npos) << printed;
  // The stored event: the run's key as sent, under the CLI's event key.
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"),
                  "SELECT count(*) FROM saga_events WHERE idempotency_key = $1 AND "
                  "name = 'payment_confirmed' AND event_key = 'cli-confirmed'",
                  key),
            1);
  auto order = Collect(c, "replies_cli", 1)["order"];
  Record(records[0], order);
  EXPECT_EQ(records[0].final_status, 201) << records[0].final_body;

  // The same event key over the queue: the stored answer, which the CLI printed pretty.
  c.Publish("orders_cli.events",
            Event("demo", key, "payment_confirmed", "cli-confirmed", "{}", "replies_cli", "copy"));
  auto copy = Collect(c, "replies_cli", 1)["copy"];
  ASSERT_EQ(copy.size(), 1u);
  EXPECT_EQ(copy[0].status, 202);
  auto printed_body = nlohmann::json::parse(printed.substr(printed.find('{')));
  EXPECT_EQ(nlohmann::json::parse(copy[0].body), printed_body);
  // A refusal is a failure: exit 1 with the problem printed.
  exit = idemsaga::common::RunProgram(
      {IDEMSAGA_BINARY, "event", "--url", stack.OrchestratorUrl(0), "--api-key", "dev-key-demo",
       "--run", key, "--name", "shipped", "--key", "cli-other"},
      log);
  EXPECT_EQ(exit, 1);
  EXPECT_EQ(Count(stack.DatabaseUrl("orchestrator"), "SELECT count(*) FROM saga_events"), 1);
  ExpectClean(stack, records, "amqp_cli_event");
}

}  // namespace

namespace {

// A defect once: deliveries that arrived while a publish awaited its confirm were read as
// stray frames and dropped, so a consumer with a prefetch above one that published (a reply, a
// dead letter) lost the messages behind the one in hand. They are kept for Next, in order.
class AmqpConnection : public chaos::BrokerSuite {};

TEST_F(AmqpConnection, DeliveriesThatArriveDuringAConfirmAreKeptForNextInOrder) {
  Connection pub(broker_->Url());
  pub.DeclareQueue("conn_in");
  pub.DeclareQueue("conn_out");
  pub.Confirm();
  for (int i = 0; i < 6; ++i) pub.Publish("conn_in", {.body = "m" + std::to_string(i)});
  Connection c(broker_->Url());
  c.Confirm();
  c.Prefetch(4);
  c.Consume("conn_in");
  std::vector<std::string> seen;
  for (int round = 0; round < 6; ++round) {
    auto d = c.Next(std::chrono::seconds(5));
    ASSERT_TRUE(d) << "after " << seen.size() << " messages";
    seen.push_back(d->message.body);
    // While this waits for its confirm, the broker pushes the next deliveries (prefetch 4).
    c.Publish("conn_out", {.body = "reply to " + d->message.body});
    c.Ack(d->tag);
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"m0", "m1", "m2", "m3", "m4", "m5"}));
  EXPECT_EQ(pub.DeclareQueue("conn_out"), 6u);
}

}  // namespace
