// The inventory on Redis (--store redis) over real HTTP, against a private redis-server per
// test (tests/support/redis_harness.hpp): the guard's promise counted in Redis itself, answers
// compared byte for byte with the PostgreSQL inventory's, durability across a crash, an outage,
// hostile input, and whole orders through the real orchestrator.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <regex>
#include <thread>

#include "common/crypto.hpp"
#include "common/http/problem.hpp"
#include "common/net.hpp"
#include "demo/redis_inventory.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/redis_harness.hpp"
#include "tests/support/serving.hpp"
#include "tests/support/wait.hpp"

namespace {

using idemsaga::common::redis::Pool;
using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantOptions;
using idemsaga::demo::ParticipantService;
using idemsaga::demo::RedisInventory;
using idemsaga::steps::guard::RedisGuard;
using test_support::Call;
using test_support::Post;
using test_support::RedisServer;
using test_support::ScratchDatabase;
using test_support::Serving;
using namespace std::chrono_literals;
using Running = Serving<ParticipantService>;

constexpr const char* kTwoWidgets = R"({"items":[{"sku":"widget","quantity":2}]})";

ParticipantOptions OnRedis(const std::string& url, std::chrono::seconds retention = 168h) {
  return {.pool_size = 8, .guard = {.retention = retention}, .redis_url = url};
}

class RedisInventoryTest : public ::testing::Test {
 protected:
  RedisInventoryTest()
      : redis_({.appendfsync = "always"}),
        inspect_({.url = redis_.Url(), .size = 2}),
        svc_(std::make_unique<Running>(ParticipantKind::kInventory, "", OnRedis(redis_.Url()))),
        client_(svc_->Client()) {}

  long long Field(const std::string& key, const std::string& field) {
    auto r = inspect_.Command({"HGET", key, field});
    return r.type == idemsaga::common::redis::Reply::Type::kString ? std::stoll(r.str) : -1;
  }
  long long Available(const std::string& sku) {
    return Field(RedisInventory::StockKey(sku), "available");
  }
  long long Reserved(const std::string& sku) {
    return Field(RedisInventory::StockKey(sku), "reserved");
  }
  std::vector<std::string> Keys(const std::string& pattern) {
    std::vector<std::string> out;
    for (const auto& e : inspect_.Command({"KEYS", pattern}).elements) out.push_back(e.str);
    return out;
  }
  long long DbSize() { return inspect_.Command({"DBSIZE"}).integer; }
  std::string Status(const std::string& key) {
    return inspect_.Command({"HGET", key, "status"}).str;
  }
  httplib::Result Reserve(const std::string& key, const std::string& body = kTwoWidgets) {
    return Post(client_, "/v1/reservations", {.key = key, .body = body});
  }
  httplib::Result Release(const std::string& key, const std::string& action_key,
                          bool applied = false) {
    nlohmann::json body = {{"action_key", action_key}};
    if (applied) body["action_applied"] = true;
    return Post(client_, "/v1/reservations/release", {.key = key, .body = body.dump()});
  }

  RedisServer redis_;
  idemsaga::common::redis::Pool inspect_;
  std::unique_ptr<Running> svc_;
  httplib::Client client_;
};

TEST_F(RedisInventoryTest, SeedsTheSameStockAsThePostgresInventoryAndKeepsItOnRestart) {
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(Available("gadget"), 10);
  ASSERT_EQ(Reserve("seed-1")->status, 201);
  svc_.reset();  // a restart of the service seeds only what is absent
  svc_ = std::make_unique<Running>(ParticipantKind::kInventory, "", OnRedis(redis_.Url()));
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  EXPECT_EQ(Reserved("widget"), 2);
}

TEST_F(RedisInventoryTest, FiftyConcurrentDuplicatesMakeOneReservationAndByteIdenticalAnswers) {
  constexpr int kDuplicates = 50;
  std::vector<std::thread> threads;
  std::vector<int> statuses(kDuplicates);
  std::vector<std::string> bodies(kDuplicates), replayed(kDuplicates);
  std::atomic<int> ready{0};
  for (int i = 0; i < kDuplicates; ++i) {
    threads.emplace_back([&, i] {
      auto c = svc_->Client();
      ++ready;
      while (ready < kDuplicates) std::this_thread::yield();
      auto r = Post(c, "/v1/reservations", {.key = "dup-inventory", .body = kTwoWidgets});
      statuses[i] = r ? r->status : -1;
      bodies[i] = r ? r->body : "";
      replayed[i] = r ? r->get_header_value("Idempotent-Replayed") : "";
    });
  }
  for (auto& t : threads) t.join();
  int applied = 0;
  for (int i = 0; i < kDuplicates; ++i) {
    ASSERT_EQ(statuses[i], 201) << bodies[i];  // a script runs alone: never "in progress"
    EXPECT_EQ(bodies[i], bodies[0]);
    applied += replayed[i] != "true";
  }
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(Keys("inv:res:*").size(), 1u);
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  EXPECT_EQ(Reserved("widget"), 2);
}

TEST_F(RedisInventoryTest, AKeyReusedWithAnotherBodyIs422AndStoresNothing) {
  auto first = Reserve("reuse-inventory");
  ASSERT_EQ(first->status, 201);
  const auto size = DbSize();
  auto reused = Reserve("reuse-inventory", R"({"items":[{"sku":"widget","quantity":3}]})");
  ASSERT_TRUE(reused);
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(reused->body, idemsaga::common::http::ProblemBody(
                              422, "idempotency_key_reused",
                              "this Idempotency-Key was used with a different request"));
  EXPECT_EQ(DbSize(), size);
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  // The same request in another JSON spelling is the same request: a replay.
  auto replay = Reserve("reuse-inventory", R"({ "items": [ {"quantity": 2, "sku": "widget"} ] })");
  EXPECT_EQ(replay->body, first->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
}

TEST_F(RedisInventoryTest, InsufficientStockIsStoredAndReplayedAndTakesNothingFromAnySku) {
  const std::string body =
      R"({"items":[{"sku":"widget","quantity":1},{"sku":"gadget","quantity":11}]})";
  auto r = Reserve("short-inventory", body);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(r->body, idemsaga::common::http::ProblemBody(
                         409, "insufficient_stock", "only 10 of 'gadget' available, 11 wanted"));
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_EQ(Available("gadget"), 10);
  EXPECT_TRUE(Keys("inv:res:*").empty());
  auto again = Reserve("short-inventory", body);
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(again->body, r->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  auto unknown = Reserve("unicorn-inventory", R"({"items":[{"sku":"unicorn","quantity":1}]})");
  EXPECT_EQ(unknown->body, idemsaga::common::http::ProblemBody(409, "insufficient_stock",
                                                               "unknown SKU 'unicorn'"));
}

TEST_F(RedisInventoryTest, AReleaseBeforeItsReservationLeavesATombstoneThatRefusesTheLateOne) {
  auto release = Release("late-inventory-compensate", "late-inventory");
  ASSERT_TRUE(release);
  EXPECT_EQ(release->status, 200);
  EXPECT_EQ(nlohmann::json::parse(release->body)["outcome"], "cancelled");
  EXPECT_EQ(Status(RedisGuard::RecordKey("demo", "late-inventory")), "tombstone");
  auto late = Reserve("late-inventory");
  ASSERT_TRUE(late);
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(nlohmann::json::parse(late->body)["code"], "cancelled");
  EXPECT_EQ(Available("widget"), 1000000);
  EXPECT_TRUE(Keys("inv:res:*").empty());
}

TEST_F(RedisInventoryTest, ReleasingTwiceRestoresStockOnceAndTheUndoneActionSaysCompensated) {
  ASSERT_EQ(Reserve("twice-inventory", R"({"items":[{"sku":"gadget","quantity":3}]})")->status,
            201);
  EXPECT_EQ(Available("gadget"), 7);
  auto first = Release("twice-inventory-compensate", "twice-inventory");
  auto replay = Release("twice-inventory-compensate", "twice-inventory");
  auto other = Release("twice-inventory-compensate-2", "twice-inventory");
  ASSERT_TRUE(first && replay && other);
  auto body = nlohmann::json::parse(first->body);
  EXPECT_EQ(body["outcome"], "undone");
  EXPECT_EQ(body["released"], true);
  EXPECT_EQ(replay->body, first->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(nlohmann::json::parse(other->body)["outcome"], "already_undone");
  EXPECT_EQ(Available("gadget"), 10);
  EXPECT_EQ(Reserved("gadget"), 0);
  EXPECT_EQ(Status(RedisInventory::ReservationKey("demo", "twice-inventory")), "released");
  auto retried = Reserve("twice-inventory", R"({"items":[{"sku":"gadget","quantity":3}]})");
  EXPECT_EQ(retried->status, 409);
  EXPECT_EQ(nlohmann::json::parse(retried->body)["code"], "compensated");
  EXPECT_EQ(Available("gadget"), 10);
}

TEST_F(RedisInventoryTest, ACompensationOfAnUnknownAppliedActionIs409AndStoresNothing) {
  const auto size = DbSize();
  auto r = Release("ghost-inventory-compensate", "ghost-inventory", /*applied=*/true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(nlohmann::json::parse(r->body)["code"], "action_unknown");
  EXPECT_EQ(DbSize(), size);
}

// Keys live the retention from their last write: an action's clock restarts when its
// compensation undoes it, so the record outlives any retry the orchestrator may still send.
TEST_F(RedisInventoryTest, KeysExpireAfterTheRetentionCountedFromTheirCompensation) {
  ASSERT_EQ(Reserve("ttl-inventory")->status, 201);
  const long long retention_ms = 168LL * 3600 * 1000;
  auto pttl = [&](const std::string& key) { return inspect_.Command({"PTTL", key}).integer; };
  const auto record = RedisGuard::RecordKey("demo", "ttl-inventory");
  EXPECT_GT(pttl(record), retention_ms - 60000);
  EXPECT_LE(pttl(record), retention_ms);
  EXPECT_GT(pttl(RedisInventory::ReservationKey("demo", "ttl-inventory")), 0);
  inspect_.Command({"PEXPIRE", record, "1000000"});  // as if most of its life had passed
  ASSERT_EQ(Release("ttl-inventory-compensate", "ttl-inventory")->status, 200);
  EXPECT_GT(pttl(record), retention_ms - 60000);
  EXPECT_GT(pttl(RedisGuard::RecordKey("demo", "ttl-inventory-compensate")), retention_ms - 60000);
  // A key read past half its life is kept a full retention again.
  inspect_.Command({"PEXPIRE", record, "1000000"});
  EXPECT_EQ(Reserve("ttl-inventory")->status, 409);  // compensated
  EXPECT_GT(pttl(record), retention_ms - 60000);
}

TEST_F(RedisInventoryTest, AReplayAfterARedisCrashUnderAppendfsyncAlwaysIsByteIdentical) {
  auto first = Reserve("crash-inventory");
  ASSERT_EQ(first->status, 201);
  redis_.Kill();  // SIGKILL: only what appendfsync always already wrote survives
  redis_.Restart();
  auto replay = Reserve("crash-inventory");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 201) << replay->body;
  EXPECT_EQ(replay->body, first->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  EXPECT_EQ(Keys("inv:res:*").size(), 1u);
}

TEST_F(RedisInventoryTest, RedisDownIs503AndARetryWithTheSameKeyAppliesOnce) {
  redis_.Stop();
  auto down = Reserve("outage-inventory");
  ASSERT_TRUE(down);
  EXPECT_EQ(down->status, 503);
  auto ready = client_.Get("/readyz");
  EXPECT_EQ(ready->status, 503);
  redis_.Restart();
  auto retry = Reserve("outage-inventory");
  ASSERT_TRUE(retry);
  EXPECT_EQ(retry->status, 201) << retry->body;
  EXPECT_EQ(Reserve("outage-inventory")->body, retry->body);
  EXPECT_EQ(Available("widget"), 1000000 - 2);
  EXPECT_EQ(client_.Get("/readyz")->status, 200);
}

// A TCP relay to Redis on loopback that can hold back the next reply Redis sends: the one
// failure a timeout cannot tell apart from a lost request (the script ran; its answer did not
// arrive in time).
class ReplyDelayingRelay {
 public:
  explicit ReplyDelayingRelay(int redis_port) : redis_port_(redis_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    port_ = idemsaga::common::FreeLoopbackPort();
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener_, 64) != 0) {
      throw std::runtime_error("relay: cannot listen");
    }
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~ReplyDelayingRelay() {
    stop_ = true;
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    acceptor_.join();
    for (auto& t : pipes_) t.join();
  }
  std::string Url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // The next reply from Redis reaches its client `d` late.
  void DelayNextReply(std::chrono::milliseconds d) { delay_ms_ = d.count(); }

 private:
  void Accept() {
    while (!stop_) {
      int client = accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(redis_port_));
      if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(client);
        close(server);
        continue;
      }
      pipes_.emplace_back([this, client, server] { Pipe(client, server); });
    }
  }
  void Pipe(int client, int server) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    char buf[65536];
    while (!stop_ && poll(fds, 2, 100) >= 0) {
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) {
          close(client);
          close(server);
          return;
        }
        if (i == 1) {
          if (long long d = delay_ms_.exchange(0)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(d));
          }
        }
        if (write(fds[1 - i].fd, buf, static_cast<size_t>(n)) != n) {
          close(client);
          close(server);
          return;
        }
      }
    }
    close(client);
    close(server);
  }

  int redis_port_;
  int port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<long long> delay_ms_{0};
  std::thread acceptor_;
  std::vector<std::thread> pipes_;  // joined on destruction; only Accept() adds to it
};

TEST_F(RedisInventoryTest, AnAnswerLostAfterTheScriptRanIsAskedAgainAndAppliesOnce) {
  ReplyDelayingRelay relay(redis_.port());
  Running svc(ParticipantKind::kInventory, "", OnRedis(relay.Url()));
  auto client = svc.Client();
  long long before = Available("widget");
  // The script runs and takes the stock; its answer arrives after the command timeout (2 s).
  relay.DelayNextReply(3s);
  auto first = Post(client, "/v1/reservations", {.key = "lost-answer", .body = kTwoWidgets});
  ASSERT_TRUE(first);
  // Asked again on a fresh connection, the script finds the key and replays it: the effect
  // happened once, and the caller gets its answer (marked as the replay it is).
  EXPECT_EQ(first->status, 201) << first->body;
  EXPECT_EQ(Available("widget"), before - 2);
  EXPECT_EQ(Keys("inv:res:demo:lost-answer").size(), 1u);
  auto again = Post(client, "/v1/reservations", {.key = "lost-answer", .body = kTwoWidgets});
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(Available("widget"), before - 2);
}

TEST_F(RedisInventoryTest, ServesPolicyKeysMetricsAndStockLikeThePostgresInventory) {
  ASSERT_EQ(Reserve("admin-inventory")->status, 201);
  ASSERT_EQ(Reserve("admin-inventory")->status, 201);
  ASSERT_EQ(Release("tomb-inventory-compensate", "tomb-inventory")->status, 200);
  httplib::Headers auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}};
  auto policy = client_.Get("/v1/idempotency", auth);
  EXPECT_EQ(nlohmann::json::parse(policy->body)["key_retention_seconds"], 168 * 3600);
  auto keys = client_.Get("/v1/idempotency/keys?tenant=demo&since_seconds=3600", auth);
  ASSERT_EQ(keys->status, 200);
  auto listed = nlohmann::json::parse(keys->body)["keys"];
  ASSERT_EQ(listed.size(), 3u) << keys->body;
  EXPECT_EQ(listed[0]["key"], "admin-inventory");
  EXPECT_EQ(listed[0]["response_status"], 201);
  EXPECT_EQ(listed[1]["key"], "tomb-inventory");
  EXPECT_EQ(listed[1]["status"], "tombstone");
  auto metrics = client_.Get("/metrics")->body;
  EXPECT_NE(
      metrics.find(
          R"(idemsaga_guard_requests_total{service="inventory",kind="action",outcome="applied"} 1)"),
      std::string::npos)
      << metrics;
  EXPECT_NE(
      metrics.find(
          R"(idemsaga_guard_requests_total{service="inventory",kind="action",outcome="replayed"} 1)"),
      std::string::npos);
  EXPECT_NE(metrics.find(R"(kind="compensation",outcome="tombstoned"} 1)"), std::string::npos);
  auto stock = client_.Get("/v1/stock/widget", auth);
  EXPECT_EQ(stock->body, R"({"available":999998,"reserved":2,"sku":"widget"})");
  EXPECT_EQ(client_.Get("/v1/stock/unicorn", auth)->status, 404);
  EXPECT_EQ(client_.Get("/healthz")->status, 200);
  EXPECT_EQ(client_.Get("/openapi.json")->status, 200);
}

// Thousands of requests each wrong in at least one way: never a 5xx, and Redis holds exactly
// the seeded stock afterwards.
TEST_F(RedisInventoryTest, HostileInputsAreRefusedWith4xxAndStoreNothing) {
  std::mt19937 rng(14);
  auto pick = [&](const std::vector<std::string>& from) { return from[rng() % from.size()]; };
  const std::vector<std::string> bad_keys = {"",
                                             std::string(256, 'k'),
                                             "a\x01"
                                             "b",
                                             "\"a\", \"b\"",
                                             "caf\xc3\xa9",
                                             "\x7f",
                                             "\"open",
                                             "\"\\q\""};
  const std::vector<std::string> good_keys = {"hostile-1", "\"quoted key\"", "x"};
  const std::vector<std::string> bad_bodies = {
      "",
      "{",
      "[]",
      "null",
      R"({"items":[]})",
      R"({"items":[{"sku":"widget","quantity":0}]})",
      R"({"items":[{"sku":"widget","quantity":-1}]})",
      R"({"items":[{"sku":"Widget","quantity":1}]})",
      R"({"items":[{"sku":"widget","quantity":1.5}]})",
      R"({"items":[{"sku":"widget","quantity":"1"}]})",
      R"({"items":[{"sku":"widget","quantity":1,"extra":1}]})",
      R"({"items":[{"sku":"widget","quantity":1}],"more":true})",
      R"({"items":[{"sku":"widget","quantity":99999999999999999999}]})",
      std::string(2000, '[') + std::string(2000, ']'),
      R"({"items":"widget"})",
      R"({"action_key":""})",
      R"({"action_key":"x","action_applied":"yes"})",
      "\xff\xfe"};
  const std::vector<std::string> good_bodies = {kTwoWidgets, R"({"action_key":"hostile-0"})"};
  const std::vector<std::string> paths = {"/v1/reservations", "/v1/reservations/release"};
  const auto seeded = DbSize();
  int cases = 0, server_errors = 0;
  for (int i = 0; i < 3000; ++i) {
    Call call{.key = pick(good_keys), .body = pick(good_bodies)};
    switch (i % 6) {  // one thing wrong at least, sometimes several
      case 0:
        call.key = pick(bad_keys);
        break;
      case 1:
        call.body = pick(bad_bodies);
        break;
      case 2:
        call.tenant = pick({"", "bad tenant", std::string(65, 't'), "t\x01"});
        break;
      case 3:
        call.token = pick({"", "wrong-token"});
        break;
      case 4:
        call.content_type = pick({"text/plain", "application/jsonx", ""});
        break;
      default:
        call.key = pick(bad_keys);
        call.body = pick(bad_bodies);
    }
    auto path = pick(paths);
    auto r = Post(client_, path, call);
    if (!r) continue;  // refused at the edge (a malformed header the client would not send)
    ++cases;
    server_errors += r->status >= 500;
    EXPECT_LT(r->status, 500) << path << " key=" << call.key << " body=" << call.body;
    if (r->status < 400) ADD_FAILURE() << "accepted: " << path << " " << call.body;
  }
  EXPECT_GT(cases, 2500);
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(DbSize(), seeded);
  EXPECT_EQ(Available("widget"), 1000000);
}

TEST(RedisInventoryStartTest, RefusesARedisThatWouldLoseMoreThanItIsToldToAccept) {
  RedisServer everysec({.appendfsync = "everysec"});
  auto options = OnRedis(everysec.Url());
  options.redis_fsync = "always";
  EXPECT_THROW(ParticipantService(ParticipantKind::kInventory, "", options), std::runtime_error);
  options.redis_fsync = "everysec";
  EXPECT_NO_THROW(ParticipantService(ParticipantKind::kInventory, "", options));
  auto payment = OnRedis(everysec.Url());
  EXPECT_THROW(ParticipantService(ParticipantKind::kPayment, "", payment), std::invalid_argument);
}

// The same requests against both stores: statuses, bodies (reservation ids aside) and the
// replay header are the same bytes.
TEST(RedisInventoryParityTest, AnswersMatchThePostgresInventoryByteForByte) {
  RedisServer redis;
  ScratchDatabase db("inventory");
  Running on_redis(ParticipantKind::kInventory, "", OnRedis(redis.Url()));
  Running on_pg(ParticipantKind::kInventory, db.url(), ParticipantOptions{.pool_size = 4});
  struct Step {
    std::string path, key, body;
  };
  const std::vector<Step> steps = {
      {"/v1/reservations", "P1-inventory", kTwoWidgets},
      {"/v1/reservations", "P1-inventory", kTwoWidgets},
      {"/v1/reservations", "P1-inventory", R"({"items":[{"sku":"widget","quantity":3}]})"},
      {"/v1/reservations", "P2-inventory",
       R"({"items":[{"sku":"widget","quantity":1},{"sku":"gadget","quantity":11}]})"},
      {"/v1/reservations", "P2-inventory",
       R"({"items":[{"sku":"widget","quantity":1},{"sku":"gadget","quantity":11}]})"},
      {"/v1/reservations", "P3-inventory", R"({"items":[{"sku":"unicorn","quantity":1}]})"},
      {"/v1/reservations", "P4-inventory",
       R"({"items":[{"sku":"gadget","quantity":2},{"sku":"widget","quantity":1},{"sku":"gadget","quantity":1}]})"},
      {"/v1/reservations/release", "P1-inventory-compensate", R"({"action_key":"P1-inventory"})"},
      {"/v1/reservations/release", "P1-inventory-compensate", R"({"action_key":"P1-inventory"})"},
      {"/v1/reservations/release", "P1-c2", R"({"action_key":"P1-inventory"})"},
      {"/v1/reservations", "P1-inventory", kTwoWidgets},
      {"/v1/reservations/release", "P2-inventory-compensate", R"({"action_key":"P2-inventory"})"},
      {"/v1/reservations/release", "P5-inventory-compensate", R"({"action_key":"P5-inventory"})"},
      {"/v1/reservations", "P5-inventory", kTwoWidgets},
      {"/v1/reservations/release", "P6-inventory-compensate",
       R"({"action_key":"P6-inventory","action_applied":true})"},
      {"/v1/reservations/release", "P4-inventory-compensate", R"({"action_key":"P4-inventory"})"},
      {"/v1/reservations", "P7-inventory", R"({"items":[{"sku":"widget","quantity":0}]})"},
      {"/v1/reservations", "P8-inventory", R"({"items":[{"sku":"gadget","quantity":10}]})"},
  };
  const std::regex id("res_[0-9a-f]{32}");
  auto redis_client = on_redis.Client();
  auto pg_client = on_pg.Client();
  for (const auto& s : steps) {
    auto a = Post(redis_client, s.path, {.key = s.key, .body = s.body});
    auto b = Post(pg_client, s.path, {.key = s.key, .body = s.body});
    ASSERT_TRUE(a && b);
    SCOPED_TRACE(s.path + " " + s.key + " " + s.body);
    EXPECT_EQ(a->status, b->status);
    EXPECT_EQ(std::regex_replace(a->body, id, "res_ID"), std::regex_replace(b->body, id, "res_ID"));
    EXPECT_EQ(a->get_header_value("Content-Type"), b->get_header_value("Content-Type"));
    EXPECT_EQ(a->get_header_value("Idempotent-Replayed"),
              b->get_header_value("Idempotent-Replayed"));
    EXPECT_EQ(a->get_header_value("Retry-After"), b->get_header_value("Retry-After"));
  }
  httplib::Headers auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}};
  for (const char* sku : {"widget", "gadget"}) {
    auto path = std::string("/v1/stock/") + sku;
    EXPECT_EQ(redis_client.Get(path, auth)->body, pg_client.Get(path, auth)->body);
  }
}

// Whole orders through the real orchestrator, the inventory on Redis and payment on
// PostgreSQL: a success reserves once; a declined card releases the Redis stock.
TEST(RedisInventoryOrderTest, OrdersCompleteAndADeclinedPaymentReleasesTheRedisStock) {
  RedisServer redis;
  ScratchDatabase orch_db("orchestrator"), pay_db("payment");
  Running inventory(ParticipantKind::kInventory, "", OnRedis(redis.Url()));
  Running payment(ParticipantKind::kPayment, pay_db.url(), ParticipantOptions{});
  auto o = test_support::DemoOrchestratorOptions(
      orch_db.url(), {{"inventory", inventory.Url()}, {"payment", payment.Url()}});
  o.retry = {
      .max_attempts = 4, .initial_backoff = 5ms, .max_backoff = 40ms, .step_deadline = 4000ms};
  Serving<idemsaga::orchestrator::Orchestrator> orch(o);
  orch.service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
  auto client = orch.Client();
  idemsaga::common::redis::Pool inspect({.url = redis.Url(), .size = 1});
  auto available = [&] {
    return std::stoll(
        inspect.Command({"HGET", RedisInventory::StockKey("widget"), "available"}).str);
  };

  auto ok = Post(client, "/v1/orders", test_support::Order("redis-order-1"));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 201) << ok->body;
  EXPECT_EQ(available(), 1000000 - 2);
  auto again = Post(client, "/v1/orders", test_support::Order("redis-order-1"));
  EXPECT_EQ(again->body, ok->body);
  EXPECT_EQ(inspect.Command({"KEYS", "inv:res:*"}).elements.size(), 1u);

  auto declined = Post(client, "/v1/orders",
                       test_support::Order("redis-order-2", test_support::kDeclinedOrder));
  ASSERT_TRUE(declined);
  EXPECT_EQ(declined->status, 402) << declined->body;
  EXPECT_EQ(nlohmann::json::parse(declined->body)["compensated"],
            nlohmann::json::array({"inventory"}));
  EXPECT_EQ(available(), 1000000 - 2);
  EXPECT_EQ(inspect.Command({"HGET", RedisInventory::StockKey("widget"), "reserved"}).str, "2");
  EXPECT_EQ(inspect
                .Command({"HGET", RedisInventory::ReservationKey("demo", "redis-order-2-inventory"),
                          "status"})
                .str,
            "released");
  EXPECT_EQ(pay_db.Count("SELECT count(*) FROM charges"), 1);
}

}  // namespace
