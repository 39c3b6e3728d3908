// An effect outside the database, across real processes: a mailer participant (the guard's
// HttpGuard::ExternalAction) sends through a provider that is not idempotent (each POST sends
// one more message), so only the guard's lease, fencing token and "earlier attempt" flag stand
// between a crash and a second message. The mailer that dies or stalls mid-call is this test
// binary run again as a child process. Each case runs on every key store (PostgreSQL, Redis,
// DynamoDB on dynalite):
// part of the stores' conformance suite (participant_stores_itest.cpp).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "common/dynamo/client.hpp"
#include "common/percent_encode.hpp"
#include "common/redis/pool.hpp"
#include "steps/guard/dynamo_guard.hpp"
#include "steps/guard/http_guard.hpp"
#include "steps/guard/redis_guard.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/dynalite_harness.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/redis_harness.hpp"
#include "tests/support/serving.hpp"
#include "tests/support/wait.hpp"

namespace {

using namespace std::chrono_literals;
using idemsaga::steps::guard::ExternalCall;
using idemsaga::steps::guard::Response;
using test_support::WaitFor;

constexpr const char* kToken = "mailer-token";

// The third party: sends a message per POST, and finds one by the sender's reference.
class Provider {
 public:
  Provider() {
    server_.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      std::string ref = nlohmann::json::parse(req.body).at("ref");
      std::string id = "msg_" + std::to_string(++sends_);
      by_ref_[ref] = id;
      res.status = 201;
      res.set_content(nlohmann::json{{"id", id}}.dump(), "application/json");
    });
    server_.Get("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lock(mutex_);
      ++lookups_;
      auto it = by_ref_.find(req.get_param_value("ref"));
      if (it == by_ref_.end()) {
        res.status = 404;
        return;
      }
      res.set_content(nlohmann::json{{"id", it->second}}.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    // Bound and listening already: a client may connect before the loop starts accepting.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~Provider() {
    // stop() before the loop runs would be lost, and the loop would never end.
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_.stop();
    thread_.join();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int sends() {
    std::lock_guard lock(mutex_);
    return sends_;
  }
  int lookups() {
    std::lock_guard lock(mutex_);
    return lookups_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  int sends_ = 0, lookups_ = 0;
  std::map<std::string, std::string> by_ref_;
};

// What a careful handler does: when an earlier attempt may have reached the provider, look the
// message up by this key before sending another. `after_send` runs once the message is out.
Response SendEmail(const std::string& provider_url, const ExternalCall& call,
                   const std::function<void()>& after_send = {}) {
  httplib::Client provider(provider_url);
  const std::string& ref = call.request.tenant_id + "/" + call.request.key;
  if (call.earlier_attempt) {
    auto found = provider.Get(("/v1/messages?ref=" + idemsaga::common::PercentEncode(ref)).c_str());
    if (!found) throw std::runtime_error("provider unreachable");
    if (found->status == 200) return Response{201, found->body};
  }
  auto sent =
      provider.Post("/v1/messages", nlohmann::json{{"ref", ref}}.dump(), "application/json");
  if (!sent) throw std::runtime_error("provider unreachable");
  if (after_send) after_send();
  return Response{201, sent->body};
}

// The key store at `url` (postgresql://, redis://, or http:// for DynamoDB's API), its lease 1 s.
class Store {
 public:
  explicit Store(const std::string& url) {
    const idemsaga::steps::guard::GuardOptions options{.lease = std::chrono::seconds(1)};
    if (url.rfind("redis://", 0) == 0) {
      redis_ = std::make_unique<idemsaga::common::redis::Pool>(
          idemsaga::common::redis::Pool::Options{.url = url, .size = 4});
      store_ = std::make_unique<idemsaga::steps::guard::RedisGuard>(*redis_, options);
    } else if (url.rfind("http://", 0) == 0) {
      dynamo_ = std::make_unique<idemsaga::common::dynamo::Client>(
          idemsaga::common::dynamo::Client::FromEnvironment(url));
      auto dynamo_guard =
          std::make_unique<idemsaga::steps::guard::DynamoGuard>(*dynamo_, "keys", options);
      dynamo_guard->EnsureTable();
      store_ = std::move(dynamo_guard);
    } else {
      pool_ = std::make_unique<idemsaga::common::pg::Pool>(
          idemsaga::common::pg::Pool::Options{.url = url, .size = 4});
      store_ = std::make_unique<idemsaga::steps::guard::Guard>(*pool_, nullptr, options);
    }
  }
  idemsaga::steps::guard::KeyStore& operator*() { return *store_; }

 private:
  std::unique_ptr<idemsaga::common::pg::Pool> pool_;
  std::unique_ptr<idemsaga::common::redis::Pool> redis_;
  std::unique_ptr<idemsaga::common::dynamo::Client> dynamo_;
  std::unique_ptr<idemsaga::steps::guard::KeyStore> store_;
};

// The mailer service: POST /v1/emails on the key store at `store_url`. A plain
// httplib::Server: the guard's handler fits any cpp-httplib route, not only idemsaga's own.
class Mailer {
 public:
  Mailer(const std::string& store_url, const std::string& provider_url,
         std::function<void()> after_send = {})
      : store_(store_url), http_(*store_, {.service_token = kToken}) {
    server_.Post("/v1/emails",
                 http_.ExternalAction(nullptr, [provider_url, after_send](const ExternalCall& c) {
                   return SendEmail(provider_url, c, after_send);
                 }));
  }
  int Bind(const std::string& host, int port) {
    return port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port), port);
  }
  void Serve() { server_.listen_after_bind(); }
  void Stop() {
    // stop() before the loop runs would be lost, and the loop would never end.
    for (int i = 0; i < 5000 && !server_.is_running(); ++i) std::this_thread::sleep_for(1ms);
    server_.stop();
  }

 private:
  Store store_;
  idemsaga::steps::guard::HttpGuard http_;
  httplib::Server server_;
};

httplib::Result Email(httplib::Client& client, const std::string& key) {
  return client.Post("/v1/emails",
                     {{"Authorization", std::string("Bearer ") + kToken},
                      {"X-Tenant-ID", "demo"},
                      {"Idempotency-Key", key}},
                     R"({"to":"ann@example.com"})", "application/json");
}

// The child: a mailer whose handler, once the message is out, hangs (to be killed) or stalls
// past its lease (to come back as a zombie). Skipped unless the parent ran it.
TEST(MailerChild, ServesUntilKilledOrStalled) {
  const char* store = std::getenv("MAILER_CHILD_STORE");
  if (store == nullptr) GTEST_SKIP() << "run by GuardExternal tests";
  std::string mode = std::getenv("MAILER_CHILD_MODE");
  test_support::Serving<Mailer> mailer(store, std::getenv("MAILER_CHILD_PROVIDER"), [mode] {
    std::this_thread::sleep_for(mode == "hang" ? 60s : 5s);
  });
  std::cout << "mailer-child-port=" << mailer.port << std::endl;
  std::this_thread::sleep_for(mode == "hang" ? 60s : 10s);
}

enum class StoreKind { kPostgres, kRedis, kDynamo };

class GuardExternal : public ::testing::TestWithParam<StoreKind> {
 protected:
  GuardExternal() : db_("payment") {
    if (GetParam() == StoreKind::kRedis) redis_ = std::make_unique<test_support::RedisServer>();
    if (GetParam() == StoreKind::kDynamo) dynalite_ = std::make_unique<test_support::Dynalite>();
    store_url_ = redis_ ? redis_->Url() : dynalite_ ? dynalite_->Url() : db_.url();
  }

  // The stored record of `key` as the reconciler lists it.
  std::optional<idemsaga::steps::protocol::KeyRecord> Record(const std::string& key) {
    Store store(store_url_);
    for (const auto& k : (*store).ListKeys("demo", std::chrono::hours(1), "", 1000)) {
      if (k.key == key) return k;
    }
    return std::nullopt;
  }

  // Starts the child mailer in `mode`; returns its port.
  int StartChild(const std::string& mode) {
    log_ = ::testing::TempDir() + "mailer_child_" + std::to_string(getpid()) + ".log";
    std::remove(log_.c_str());
    child_ = std::make_unique<chaos::Process>(
        std::vector<std::string>{"/proc/self/exe", "--gtest_filter=MailerChild.*"},
        std::map<std::string, std::string>{{"MAILER_CHILD_STORE", store_url_},
                                           {"MAILER_CHILD_PROVIDER", provider_.Url()},
                                           {"MAILER_CHILD_MODE", mode}},
        log_);
    int port = 0;
    EXPECT_TRUE(WaitFor(
        [&] {
          std::ifstream in(log_);
          std::string line;
          while (std::getline(in, line)) {
            if (line.rfind("mailer-child-port=", 0) == 0) port = std::stoi(line.substr(18));
          }
          return port != 0;
        },
        20s));
    return port;
  }

  // Retries `key` on a fresh mailer until it answers 201 (409 while the claim is held).
  httplib::Result RetryUntilDone(test_support::Serving<Mailer>& mailer, const std::string& key) {
    auto client = mailer.Client();
    auto deadline = std::chrono::steady_clock::now() + 20s;
    httplib::Result r = Email(client, key);
    while (!(r && r->status == 201) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(100ms);
      r = Email(client, key);
    }
    return r;
  }

  test_support::ScratchDatabase db_;  // a participant database: it has the guard's key table
  std::unique_ptr<test_support::RedisServer> redis_;
  std::unique_ptr<test_support::Dynalite> dynalite_;
  std::string store_url_;
  Provider provider_;
  std::string log_;
  std::unique_ptr<chaos::Process> child_;
};

TEST_P(GuardExternal, AKill9MidCallThenARetrySendsNoSecondMessage) {
  int port = StartChild("hang");
  ASSERT_NE(port, 0);
  auto pending = std::async(std::launch::async, [port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    return Email(c, "welcome-1");
  });
  ASSERT_TRUE(WaitFor([&] { return provider_.sends() == 1; }, 20s));
  child_->Kill();  // kill -9 with the message out and nothing recorded
  EXPECT_FALSE(pending.get());
  test_support::Serving<Mailer> mailer(store_url_, provider_.Url());
  auto done = RetryUntilDone(mailer, "welcome-1");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 201) << done->body;
  EXPECT_EQ(nlohmann::json::parse(done->body)["id"], "msg_1");  // the first message, found
  EXPECT_EQ(provider_.sends(), 1);
  EXPECT_EQ(provider_.lookups(), 1);
  auto client = mailer.Client();
  auto replay = Email(client, "welcome-1");
  EXPECT_EQ(replay->body, done->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  auto record = Record("welcome-1");
  ASSERT_TRUE(record);
  EXPECT_EQ(record->status, idemsaga::steps::protocol::KeyStatus::kCompleted);
  EXPECT_EQ(record->response_status, 201);
  std::ifstream in(log_);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.find("event=guard_answer_lost"), std::string::npos) << text;
}

TEST_P(GuardExternal, AStalledHoldersLateAnswerIsRefusedAfterATakeover) {
  int port = StartChild("stall");
  ASSERT_NE(port, 0);
  auto zombie = std::async(std::launch::async, [port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    return Email(c, "welcome-2");
  });
  ASSERT_TRUE(WaitFor([&] { return provider_.sends() == 1; }, 20s));
  // The child stalls 5 s past the message with a 1 s lease: a retry takes the claim over.
  test_support::Serving<Mailer> mailer(store_url_, provider_.Url());
  auto done = RetryUntilDone(mailer, "welcome-2");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 201) << done->body;
  auto late = zombie.get();
  ASSERT_TRUE(late);
  // The zombie's answer was not stored: it is told the winner's, as a replay.
  EXPECT_EQ(late->body, done->body);
  EXPECT_EQ(late->get_header_value("Idempotent-Replayed"), "true");
  // What is stored is the winner's answer: a fresh mailer replays it.
  test_support::Serving<Mailer> fresh(store_url_, provider_.Url());
  auto client = fresh.Client();
  auto replay = Email(client, "welcome-2");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->body, done->body);
  EXPECT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(provider_.sends(), 1);
  std::ifstream in(log_);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("event=guard_fenced"), std::string::npos) << text;
}

INSTANTIATE_TEST_SUITE_P(Stores, GuardExternal,
                         ::testing::Values(StoreKind::kPostgres, StoreKind::kRedis,
                                           StoreKind::kDynamo),
                         [](const auto& info) {
                           return info.param == StoreKind::kPostgres ? "postgres"
                                  : info.param == StoreKind::kRedis  ? "redis"
                                                                     : "dynamodb";
                         });

}  // namespace
