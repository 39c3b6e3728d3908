// Participants taking their commands from RabbitMQ (docs/messaging.md), against a private
// broker (tests/chaos/rabbitmq_broker.hpp) and the run's PostgreSQL: a participant built only
// from include/idemsaga/participant.hpp (in this process), and the stock shipping participant
// (`idemsaga shipping --amqp-url`, a process of its own, killed with SIGKILL). Effects are
// counted in the participants' own tables, keys in their key tables, and every reply is
// compared byte for byte with what the HTTP route answers to the same request.
#include <gtest/gtest.h>
#include <httplib.h>

#include <idemsaga/participant.hpp>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/amqp/connection.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/pg/cluster.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/chaos/rabbitmq_broker.hpp"
#include "tests/support/metrics_text.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::common::FormatIdempotencyKey;
using idemsaga::common::amqp::Connection;
using idemsaga::common::amqp::Message;
using test_support::ScratchDatabase;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "dev-service-token";
constexpr const char* kLisbon = R"({"city":"Lisbon","nights":2})";
// The stock shipping participant's HTTP ports (this test's port range).
constexpr int kShippingPort = 28010;

// A reply or an HTTP answer, as the contract compares them.
struct Answer {
  int status = 0;
  std::string content_type;
  std::string body;
  std::map<std::string, std::string> headers;  // status and framing aside
  bool operator==(const Answer&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Answer& a) {
  os << a.status << " " << a.content_type << " " << a.body;
  for (const auto& [n, v] : a.headers) os << " [" << n << ": " << v << "]";
  return os;
}

Answer FromReply(const Message& m) {
  Answer a{std::atoi(m.headers.at("status").c_str()), m.content_type, m.body, m.headers};
  a.headers.erase("status");
  return a;
}

// A command for `path` under `key` (an sf-string header, as the orchestrator sends it).
Message Command(const std::string& path, const std::string& key, const std::string& body,
                const std::string& tenant = "demo") {
  Message m;
  m.headers["path"] = path;
  m.headers["Idempotency-Key"] = FormatIdempotencyKey(key);
  m.headers["X-Tenant-ID"] = tenant;
  m.headers["Authorization"] = std::string("Bearer ") + kToken;
  m.content_type = "application/json";
  m.body = body;
  return m;
}

// A hotel whose bookings are rows of its own database, built from the public API only. Its
// answers depend on the request alone, so twin keys get the same bytes.
class Hotel {
 public:
  Hotel(const std::string& amqp_url, const std::string& queue) : db_("guard") {
    participant_ = std::make_unique<idemsaga::Participant>(
        idemsaga::ParticipantServiceOptions{.name = "hotel",
                                            .database_url = db_.url(),
                                            .service_token = kToken,
                                            .amqp_urls = {amqp_url},
                                            .amqp_queue = queue});
    participant_
        ->Schema(
            "CREATE TABLE IF NOT EXISTS bookings (tenant_id text NOT NULL, key text NOT NULL, "
            "city text NOT NULL, nights int NOT NULL, PRIMARY KEY (tenant_id, key))")
        .Action(
            "/v1/bookings",
            [](const nlohmann::json& b) -> std::string {
              if (!b.is_object() || !b.contains("city") || !b["city"].is_string() ||
                  !b.contains("nights") || !b["nights"].is_number_integer()) {
                return "city (a string) and nights (an integer) are required";
              }
              return "";
            },
            [](pqxx::work& tx, const idemsaga::Request& r) -> idemsaga::Response {
              auto city = r.body["city"].get<std::string>();
              // A business refusal: stored and replayed like a success.
              if (city == "Atlantis") return idemsaga::Problem(422, "no_such_city", city);
              tx.exec_params("INSERT INTO bookings VALUES ($1, $2, $3, $4)", r.tenant_id, r.key,
                             city, r.body["nights"].get<long long>());
              nlohmann::json out = {{"city", city}, {"nights", r.body["nights"]}};
              return {201, out.dump(), {{"Location", "/v1/bookings/" + city}}};
            })
        .Compensation("/v1/bookings/cancel",
                      [](pqxx::work& tx, const idemsaga::Request& r,
                         const idemsaga::ActionRecord& action) -> nlohmann::json {
                        tx.exec_params("DELETE FROM bookings WHERE tenant_id = $1 AND key = $2",
                                       r.tenant_id, action.key);
                        return {{"cancelled", action.key}};
                      });
    participant_->Start("127.0.0.1", 0);
    client_ = std::make_unique<httplib::Client>(participant_->Url());
  }

  // What the HTTP route answers to the request `m` stands for.
  Answer OverHttp(const Message& m) {
    httplib::Headers headers;
    for (const auto& [n, v] : m.headers) {
      if (n != "path") headers.emplace(n, v);
    }
    auto r = client_->Post(m.headers.at("path").c_str(), headers, m.body,
                           m.content_type.empty() ? "application/json" : m.content_type.c_str());
    EXPECT_TRUE(r);
    if (!r) return {};
    Answer a{r->status, r->get_header_value("Content-Type"), r->body, {}};
    for (const auto& [n, v] : r->headers) {
      if (n != "Content-Type" && n != "Content-Length" && n != "Connection" && n != "Keep-Alive") {
        a.headers[n] = v;
      }
    }
    return a;
  }

  long long Bookings() const { return db_.Count("SELECT count(*) FROM bookings"); }
  long long Bookings(const std::string& key) const {
    return db_.Count("SELECT count(*) FROM bookings WHERE key = $1", key);
  }
  long long Keys() const { return db_.Count("SELECT count(*) FROM idempotency_keys"); }
  long long Key(const std::string& tenant, const std::string& key) const {
    return db_.Count(
        "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2",
        tenant, key);
  }
  void Stop() { participant_->Stop(); }

 private:
  ScratchDatabase db_;
  std::unique_ptr<idemsaga::Participant> participant_;
  std::unique_ptr<httplib::Client> client_;
};

class ParticipantAmqp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    idemsaga::common::SetLogEnabled(false);
    broker_dir_ = idemsaga::common::pg::PrivateCluster::MakeTempDir().string();
    broker_ = new chaos::RabbitBroker(broker_dir_);
  }
  static void TearDownTestSuite() {
    delete broker_;
    broker_ = nullptr;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(broker_dir_);
  }

  // A publisher with confirms, once `queue` and `replies` exist.
  static std::unique_ptr<Connection> Publisher(const std::string& queue,
                                               const std::string& replies) {
    auto c = std::make_unique<Connection>(broker_->Url());
    c->DeclareQueue(queue);
    c->DeclareQueue(queue + ".dead");
    c->DeclareQueue(replies);
    c->Confirm();
    return c;
  }

  // Publishes `m` to `queue` with replies to `replies` under `correlation_id`.
  static void Send(Connection& c, const std::string& queue, Message m, const std::string& replies,
                   const std::string& correlation_id) {
    m.reply_to = replies;
    m.correlation_id = correlation_id;
    c.Publish(queue, m);
  }

  // Messages on `queue` until `want` of them, or 60 s; by correlation id.
  static std::map<std::string, std::vector<Message>> Collect(Connection& c,
                                                             const std::string& queue,
                                                             size_t want) {
    std::map<std::string, std::vector<Message>> out;
    size_t got = 0;
    for (auto deadline = Clock::now() + std::chrono::seconds(60);
         got < want && Clock::now() < deadline;) {
      auto m = c.Get(queue);
      if (!m) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      out[m->correlation_id].push_back(*m);
      ++got;
    }
    return out;
  }

  static std::string broker_dir_;
  static chaos::RabbitBroker* broker_;
};

std::string ParticipantAmqp::broker_dir_;
chaos::RabbitBroker* ParticipantAmqp::broker_ = nullptr;

TEST_F(ParticipantAmqp, ACommandIsAnsweredWithTheHttpBytesAndFiftyCopiesMakeOneEffect) {
  Hotel hotel(broker_->Url(), "hotel_once");
  auto c = Publisher("hotel_once", "replies_once");
  Send(*c, "hotel_once", Command("/v1/bookings", "A-hotel", kLisbon), "replies_once", "first");
  auto first = Collect(*c, "replies_once", 1)["first"];
  ASSERT_EQ(first.size(), 1u);
  auto answer = FromReply(first[0]);
  EXPECT_EQ(answer.status, 201) << answer;
  EXPECT_EQ(answer.headers.count("Idempotent-Replayed"), 0u);
  // The same command on a twin key over HTTP: the same bytes, headers and all.
  EXPECT_EQ(hotel.OverHttp(Command("/v1/bookings", "B-hotel", kLisbon)), answer);

  constexpr int kCopies = 50;
  for (int i = 0; i < kCopies; ++i) {
    Send(*c, "hotel_once", Command("/v1/bookings", "A-hotel", kLisbon), "replies_once",
         "copy" + std::to_string(i));
  }
  auto copies = Collect(*c, "replies_once", kCopies);
  auto replayed = answer;
  replayed.headers["Idempotent-Replayed"] = "true";
  int identical = 0;
  for (int i = 0; i < kCopies; ++i) {
    const auto& rs = copies["copy" + std::to_string(i)];
    ASSERT_EQ(rs.size(), 1u) << i;
    EXPECT_EQ(FromReply(rs[0]), replayed) << i;
    identical += FromReply(rs[0]) == replayed ? 1 : 0;
  }
  // One key sent both ways is one effect: HTTP replays the queue's answer.
  EXPECT_EQ(hotel.OverHttp(Command("/v1/bookings", "A-hotel", kLisbon)), replayed);
  EXPECT_EQ(hotel.Bookings("A-hotel"), 1);
  EXPECT_EQ(hotel.Bookings(), 2);  // A and its HTTP twin B

  // A key with every awkward byte arrives as those bytes.
  const std::string odd = "order 7/\"x\"\\y,z;-hotel";
  Send(*c, "hotel_once", Command("/v1/bookings", odd, kLisbon), "replies_once", "odd");
  auto odd_reply = Collect(*c, "replies_once", 1)["odd"];
  ASSERT_EQ(odd_reply.size(), 1u);
  EXPECT_EQ(FromReply(odd_reply[0]).status, 201);
  EXPECT_EQ(hotel.Bookings(odd), 1);
  EXPECT_EQ(hotel.Key("demo", odd), 1);

  // A compensation over the queue undoes its action once.
  Send(*c, "hotel_once",
       Command("/v1/bookings/cancel", "A-hotel-compensate", R"({"action_key":"A-hotel"})"),
       "replies_once", "undo");
  auto undo = Collect(*c, "replies_once", 1)["undo"];
  ASSERT_EQ(undo.size(), 1u);
  EXPECT_EQ(FromReply(undo[0]).status, 200) << FromReply(undo[0]);
  EXPECT_EQ(hotel.Bookings("A-hotel"), 0);
  EXPECT_EQ(hotel.Keys(), 4);  // A, B, the odd key, A's compensation
  EXPECT_EQ(c->DeclareQueue("hotel_once.dead"), 0u);
  EXPECT_EQ(c->DeclareQueue("hotel_once"), 0u);
  std::cout << "participant_amqp once: " << kCopies << " copies -> "
            << hotel.Bookings("A-hotel") + 1 << " effect, " << identical
            << " identical replies; twin key over HTTP: same bytes" << std::endl;
}

TEST_F(ParticipantAmqp, RefusedCommandsAreDeadLetteredWithTheHttpAnswerAndStoreNothing) {
  Hotel hotel(broker_->Url(), "hotel_refused");
  auto c = Publisher("hotel_refused", "replies_refused");
  // The key A-hotel is taken first, so that another body under it is a reuse.
  Send(*c, "hotel_refused", Command("/v1/bookings", "A-hotel", kLisbon), "replies_refused", "A");
  ASSERT_EQ(Collect(*c, "replies_refused", 1)["A"].size(), 1u);

  struct Case {
    std::string name;
    Message message;
    std::string error;
    bool over_http = true;  // a request HTTP can make too
  };
  auto with = [](Message m, auto change) {
    change(m);
    return m;
  };
  const Message good = Command("/v1/bookings", "R-hotel", kLisbon);
  std::vector<Case> cases = {
      {"bad json", with(good, [](Message& m) { m.body = "{\"city\":"; }), "invalid_json"},
      {"no key", with(good, [](Message& m) { m.headers.erase("Idempotency-Key"); }),
       "idempotency_key_missing"},
      {"a list of keys",
       with(good, [](Message& m) { m.headers["Idempotency-Key"] = "\"a\", \"b\""; }),
       "idempotency_key_invalid"},
      // HTTP's server refuses a control byte in a header, and a body over its limit, before
      // any route: the detail differs there.
      {"a control byte in the key",
       with(good, [](Message& m) { m.headers["Idempotency-Key"] = "\"a\x01b\""; }),
       "idempotency_key_invalid", false},
      {"the key twice", with(good, [](Message& m) { m.headers["idempotency-key"] = "R2"; }),
       "idempotency_key_invalid"},
      {"a bad tenant", with(good, [](Message& m) { m.headers["X-Tenant-ID"] = "no such!"; }),
       "unauthorized"},
      {"no tenant", with(good, [](Message& m) { m.headers.erase("X-Tenant-ID"); }), "unauthorized"},
      {"a bad token",
       with(good, [](Message& m) { m.headers["Authorization"] = "Bearer not-the-token"; }),
       "unauthorized"},
      {"another media type", with(good, [](Message& m) { m.content_type = "text/plain"; }),
       "unsupported_media_type"},
      {"too large",
       with(good,
            [](Message& m) {
              m.body = R"({"city":")" + std::string(70000, 'x') + R"(","nights":1})";
            }),
       "payload_too_large", false},
      {"an invalid booking", with(good, [](Message& m) { m.body = R"({"city":5})"; }),
       "invalid_request"},
      {"no such route", with(good, [](Message& m) { m.headers["path"] = "/v1/nothing"; }),
       "not_found"},
      {"the key reused with another body",
       with(good,
            [](Message& m) {
              m.headers["Idempotency-Key"] = "A-hotel";
              m.body = R"({"city":"Porto","nights":2})";
            }),
       "idempotency_key_reused"},
      {"no path", with(good, [](Message& m) { m.headers.erase("path"); }), "invalid_request",
       false},
      {"a path with a query", with(good, [](Message& m) { m.headers["path"] = "/v1/bookings?x"; }),
       "invalid_request", false},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Send(*c, "hotel_refused", cases[i].message, "replies_refused", std::to_string(i));
  }
  auto replies = Collect(*c, "replies_refused", cases.size());
  std::map<std::string, Message> dead;
  for (auto m = c->Get("hotel_refused.dead"); m; m = c->Get("hotel_refused.dead")) {
    dead[m->correlation_id] = *m;
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& k = cases[i];
    const auto& rs = replies[std::to_string(i)];
    ASSERT_EQ(rs.size(), 1u) << k.name;
    auto reply = FromReply(rs[0]);
    EXPECT_GE(reply.status, 400) << k.name;
    EXPECT_LT(reply.status, 500) << k.name;
    EXPECT_NE(reply.body.find("\"" + k.error + "\""), std::string::npos) << k.name << reply;
    if (k.over_http) {
      EXPECT_EQ(hotel.OverHttp(k.message), reply) << k.name;
    }
    auto d = dead.find(std::to_string(i));
    ASSERT_NE(d, dead.end()) << k.name << " was not dead-lettered";
    EXPECT_EQ(d->second.headers.at("x-idemsaga-error"), k.error) << k.name;
    EXPECT_EQ(d->second.headers.at("x-idemsaga-status"), std::to_string(reply.status)) << k.name;
    EXPECT_FALSE(d->second.headers.at("x-idemsaga-detail").empty()) << k.name;
    EXPECT_EQ(d->second.headers.count("Authorization"), 0u) << k.name;
    EXPECT_EQ(d->second.body, k.message.body) << k.name;
  }
  EXPECT_EQ(dead.size(), cases.size());
  EXPECT_EQ(hotel.Keys(), 1);  // A-hotel's alone
  EXPECT_EQ(hotel.Bookings(), 1);

  // A business refusal is the participant's answer: stored, replayed, not a dead letter.
  for (const char* id : {"atlantis1", "atlantis2"}) {
    Send(*c, "hotel_refused",
         Command("/v1/bookings", "N-hotel", R"({"city":"Atlantis","nights":1})"), "replies_refused",
         id);
  }
  auto refusals = Collect(*c, "replies_refused", 2);
  ASSERT_EQ(refusals["atlantis1"].size(), 1u);
  ASSERT_EQ(refusals["atlantis2"].size(), 1u);
  EXPECT_EQ(FromReply(refusals["atlantis1"][0]).status, 422);
  EXPECT_EQ(FromReply(refusals["atlantis1"][0]).body, FromReply(refusals["atlantis2"][0]).body);
  // Two consumers may take the copies in either order: one answers, the other replays.
  auto replayed = [&](const char* id) {
    return refusals[id][0].headers.count("Idempotent-Replayed") == 1 &&
           refusals[id][0].headers.at("Idempotent-Replayed") == "true";
  };
  EXPECT_NE(replayed("atlantis1"), replayed("atlantis2"));
  EXPECT_FALSE(c->Get("hotel_refused.dead"));
  EXPECT_EQ(hotel.Keys(), 2);
  EXPECT_EQ(c->DeclareQueue("hotel_refused"), 0u);
  std::cout << "participant_amqp refused: " << cases.size()
            << " poison commands dead-lettered, each reply equal to HTTP's answer, 0 keys stored"
            << std::endl;
}

TEST_F(ParticipantAmqp, HostileGeneratedCommandsGetNoServerErrorAndStoreExactlyTheAcceptedKeys) {
  Hotel hotel(broker_->Url(), "hotel_hostile");
  auto c = Publisher("hotel_hostile", "replies_hostile");
  std::mt19937 rng(34);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  auto printable = [&](int len) {
    std::string s;
    for (int i = 0; i < len; ++i) s += static_cast<char>(0x20 + pick(95));
    return s;
  };
  struct Sent {
    std::string tenant, key;  // the key's bytes
  };
  constexpr int kCommands = 1000;
  std::vector<Sent> sent(kCommands);
  for (int i = 0; i < kCommands; ++i) {
    std::string raw = printable(1 + pick(40)) + "-" + std::to_string(i);
    Message m = Command("/v1/bookings", raw, R"({"city":"X","nights":1})");
    switch (pick(6)) {  // the key
      case 0:
        m.headers["Idempotency-Key"] = raw;  // bare: fine unless it holds " , ; or edge spaces
        break;
      case 1:
        m.headers["Idempotency-Key"] = "\"" + raw;  // an unterminated sf-string
        break;
      case 2:
        m.headers["Idempotency-Key"] = FormatIdempotencyKey(std::string(1, char(pick(32))) + raw);
        break;
      case 3:
        m.headers["Idempotency-Key"] = FormatIdempotencyKey(std::string(260, 'k'));
        break;
      default:
        break;  // the sf-string of `raw`
    }
    switch (pick(8)) {  // the tenant
      case 0:
        m.headers["X-Tenant-ID"] = printable(1 + pick(10));
        break;
      case 1:
        m.headers["X-Tenant-ID"] = std::string(65, 't');
        break;
      default:
        m.headers["X-Tenant-ID"] = "t" + std::to_string(pick(5));
    }
    if (pick(10) == 0) m.headers["Authorization"] = "Bearer " + printable(8);
    switch (pick(8)) {  // the body
      case 0:
        m.body = printable(pick(30));
        break;
      case 1:
        m.body = std::string(40, '[') + std::string(40, ']');
        break;
      case 2:
        m.body = R"({"city":"a\u0000b","nights":1})";
        break;
      case 3:
        m.body = nlohmann::json{{"city", printable(pick(20))}, {"nights", 1e300}}.dump();
        break;
      case 4:
        m.body = nlohmann::json{{"city", printable(pick(20))}, {"nights", pick(100)}}.dump();
        break;
      default:
        m.body = nlohmann::json{{"city", "c" + std::to_string(i)}, {"nights", 1}}.dump();
    }
    if (pick(20) == 0) m.headers["path"] = "/" + printable(5);
    if (pick(20) == 0) m.headers["traceparent"] = printable(55);
    sent[i] = {m.headers["X-Tenant-ID"], raw};
    Send(*c, "hotel_hostile", m, "replies_hostile", std::to_string(i));
  }
  auto replies = Collect(*c, "replies_hostile", kCommands);
  int server_errors = 0, applied = 0, refused = 0, missing = 0;
  std::set<std::pair<std::string, std::string>> stored;
  for (int i = 0; i < kCommands; ++i) {
    const auto& rs = replies[std::to_string(i)];
    if (rs.size() != 1) {
      ++missing;
      continue;
    }
    int status = FromReply(rs[0]).status;
    server_errors += status >= 500 ? 1 : 0;
    if (status == 201) {
      ++applied;
      stored.insert({sent[i].tenant, sent[i].key});
      EXPECT_EQ(hotel.Key(sent[i].tenant, sent[i].key), 1) << sent[i].key;
    } else {
      ++refused;
    }
  }
  long long dead = 0;
  for (auto m = c->Get("hotel_hostile.dead"); m; m = c->Get("hotel_hostile.dead")) ++dead;
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(dead, refused);  // every refusal is dead-lettered: no business refusal here
  EXPECT_EQ(hotel.Keys(), static_cast<long long>(stored.size()));
  EXPECT_EQ(hotel.Bookings(), applied);
  EXPECT_GT(applied, 100);
  EXPECT_GT(refused, 100);
  std::cout << "participant_amqp hostile: " << kCommands << " commands, " << applied
            << " applied (exact key bytes stored), " << refused << " refused and dead-lettered, "
            << server_errors << " answers >= 500" << std::endl;
}

// The stock shipping participant as a process: `idemsaga shipping --amqp-url ...`.
class Shipping {
 public:
  Shipping(const std::string& db_url, const std::string& amqp_url, const std::string& queue,
           int port, const std::string& dir, std::vector<std::string> more = {})
      : port_(port) {
    std::vector<std::string> argv = {IDEMSAGA_BINARY,  "shipping",
                                     "--database-url", db_url,
                                     "--listen",       "127.0.0.1:" + std::to_string(port),
                                     "--amqp-url",     amqp_url,
                                     "--amqp-queue",   queue};
    argv.insert(argv.end(), more.begin(), more.end());
    process_ = std::make_unique<chaos::Process>(argv, std::map<std::string, std::string>{},
                                                dir + "/shipping_" + std::to_string(port) + ".log");
    httplib::Client client("127.0.0.1", port);
    for (auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
      auto r = client.Get("/healthz");
      if (r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "shipping did not start; see " << process_->log_path();
  }
  void Kill() { process_->Kill(); }
  // Until the guard has dropped `want` answers (its metrics), 30 s at most.
  bool Dropped(double want) {
    httplib::Client client("127.0.0.1", port_);
    for (auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
      auto r = client.Get("/metrics");
      if (r && r->status == 200 &&
          test_support::Sample(r->body,
                               "idemsaga_guard_requests_total{service=\"shipping\","
                               "kind=\"action\",outcome=\"dropped\"}") >= want) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  void SetFaults(const std::string& json) {
    httplib::Client client("127.0.0.1", port_);
    auto r = client.Put("/admin/faults", {{"Authorization", std::string("Bearer ") + kToken}}, json,
                        "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }

 private:
  int port_;
  std::unique_ptr<chaos::Process> process_;
};

constexpr const char* kShipment =
    R"({"reservation_id":"res_0123456789abcdef0123456789abcdef","address":{"name":"Ada Lovelace","line1":"12 St James's Square","city":"London","postal_code":"SW1Y 4JH","country":"GB"}})";

// Waits until `sql` counts `want` (30 s at most).
bool Counted(const ScratchDatabase& db, const std::string& sql, long long want) {
  for (auto deadline = Clock::now() + std::chrono::seconds(30); Clock::now() < deadline;) {
    if (db.Count(sql) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

TEST_F(ParticipantAmqp, TheStockShippingKilledBetweenEffectAndAckReplaysOnRedeliveryOneEffect) {
  ScratchDatabase db("shipping");
  auto c = Publisher("shipping_kill", "replies_kill");
  // Every answer held for ten minutes after its commit: the kill lands between the effect
  // and the reply.
  auto held = std::make_unique<Shipping>(db.url(), broker_->Url(), "shipping_kill", kShippingPort,
                                         broker_dir_,
                                         std::vector<std::string>{"--fault-latency-ms", "600000"});
  Send(*c, "shipping_kill", Command("/v1/shipments", "K-shipping", kShipment), "replies_kill",
       "kill");
  ASSERT_TRUE(Counted(db, "SELECT count(*) FROM shipments", 1));
  held->Kill();
  EXPECT_FALSE(c->Get("replies_kill")) << "answered before the kill";
  Shipping again(db.url(), broker_->Url(), "shipping_kill", kShippingPort + 1, broker_dir_);
  auto replies = Collect(*c, "replies_kill", 1)["kill"];
  ASSERT_EQ(replies.size(), 1u);
  auto reply = FromReply(replies[0]);
  EXPECT_EQ(reply.status, 201) << reply;
  EXPECT_EQ(reply.headers["Idempotent-Replayed"], "true");
  auto id = nlohmann::json::parse(reply.body)["shipment_id"].get<std::string>();
  EXPECT_EQ(db.Count("SELECT count(*) FROM shipments WHERE shipment_id = $1 AND idempotency_key = "
                     "'K-shipping'",
                     id),
            1);

  // A reply lost in the process (the answer dropped after the commit): the connection goes,
  // the broker redelivers, and the redelivery publishes the stored answer.
  again.SetFaults(R"({"drop_after_commit_rate":1})");
  Send(*c, "shipping_kill", Command("/v1/shipments", "L-shipping", kShipment), "replies_kill",
       "lost");
  ASSERT_TRUE(Counted(db, "SELECT count(*) FROM shipments", 2));
  // Dropped again on its redelivery: it is redelivered, not answered, while answers drop.
  ASSERT_TRUE(again.Dropped(2));
  EXPECT_FALSE(c->Get("replies_kill")) << "answered while its answers are dropped";
  again.SetFaults("{}");
  auto lost = Collect(*c, "replies_kill", 1)["lost"];
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(FromReply(lost[0]).status, 201);
  EXPECT_EQ(lost[0].headers.at("Idempotent-Replayed"), "true");
  EXPECT_EQ(db.Count("SELECT count(*) FROM shipments"), 2);
  EXPECT_EQ(db.Count("SELECT count(*) FROM idempotency_keys"), 2);
  EXPECT_FALSE(c->Get("replies_kill"));
  EXPECT_EQ(c->DeclareQueue("shipping_kill"), 0u);
  std::cout << "participant_amqp kill: kill -9 between effect and ack and a dropped answer -> "
               "2 commands, 2 shipments, 2 replies (both replays)"
            << std::endl;
}

}  // namespace
