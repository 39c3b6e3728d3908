// The key stores' conformance suite. idemsaga::Participant with its keys in PostgreSQL (both
// duplicate policies), in Redis (ParticipantServiceOptions::redis_url) or in DynamoDB
// (store "dynamodb"), over real HTTP against the run's PostgreSQL, a private redis-server
// (tests/support/redis_harness.hpp) and a private dynalite (dynalite_harness.hpp):
// one table of cases run on each store (effects counted in the participant's own code, replay
// bytes compared), 50 concurrent duplicates, generated hostile keys and bodies, and the whole
// transcript of answers, the key listing and /metrics compared byte for byte between the
// stores. Below the edge, each steps::guard::KeyStore's expiry and garbage collection.
// guard_external_itest.cpp holds the rest of the suite: kill -9 between the effect and its
// answer, and a stalled holder fenced, on each store.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <idemsaga/participant.hpp>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/dynamo/client.hpp"
#include "common/idempotency_key.hpp"
#include "common/redis/pool.hpp"
#include "steps/guard/dynamo_guard.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/redis_guard.hpp"
#include "tests/support/dynalite_harness.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/redis_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using test_support::Call;
using test_support::Post;

enum class Store { kPostgres, kPostgresFailFast, kRedis, kDynamo };
const std::vector<Store> kStores = {Store::kPostgres, Store::kPostgresFailFast, Store::kRedis,
                                    Store::kDynamo};

std::string NameOf(Store store) {
  switch (store) {
    case Store::kPostgres:
      return "postgres";
    case Store::kPostgresFailFast:
      return "postgres_fail_fast";
    case Store::kRedis:
      return "redis";
    case Store::kDynamo:
      return "dynamodb";
  }
  return "";
}

constexpr const char* kToken = "dev-service-token";

// The participant's side effects, counted per key where its code runs them: at most once per
// key is the promise under test.
struct Effects {
  std::mutex mutex;
  std::map<std::string, int> sent, recalled;
  int Sent(const std::string& key) {
    std::lock_guard lock(mutex);
    return sent[key];
  }
  int Recalled(const std::string& key) {
    std::lock_guard lock(mutex);
    return recalled[key];
  }
};

// A mail service whose effect is elsewhere (a provider): the external shapes, which both
// stores serve.
class Mail {
 public:
  Mail(Store store, Effects& effects) : effects_(effects) {
    idemsaga::ParticipantServiceOptions options{.name = "mail", .service_token = kToken};
    if (store == Store::kRedis) {
      redis_ = std::make_unique<test_support::RedisServer>();
      options.redis_url = redis_->Url();
      options.redis_fsync = "always";
    } else if (store == Store::kDynamo) {
      dynalite_ = std::make_unique<test_support::Dynalite>();
      options.store = "dynamodb";
      options.dynamodb_url = dynalite_->Url();
    } else {
      db_ = std::make_unique<test_support::ScratchDatabase>("guard");
      options.database_url = db_->url();
      if (store == Store::kPostgresFailFast) options.duplicates = "fail-fast";
    }
    participant_ = std::make_unique<idemsaga::Participant>(options);
    participant_
        ->ExternalAction(
            "/v1/emails",
            [](const nlohmann::json& body) {
              return body.contains("to") && body["to"].is_string() ? "" : "to is required";
            },
            [this](const idemsaga::ExternalCall& call) { return Send(call); })
        .ExternalCompensation("/v1/emails/recall", [this](const idemsaga::ExternalCall&,
                                                          const idemsaga::ActionRecord& action) {
          std::lock_guard lock(effects_.mutex);
          ++effects_.recalled[action.key];
          return nlohmann::json{{"recalled", action.body.value("email_id", "")}};
        });
    port_ = participant_->Start("127.0.0.1", 0);
  }

  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(20);
    return c;
  }

 private:
  idemsaga::Response Send(const idemsaga::ExternalCall& call) {
    const auto to = call.request.body["to"].get<std::string>();
    // A slow provider, for duplicates that arrive while the first is out.
    if (to == "slow@example.com") std::this_thread::sleep_for(std::chrono::milliseconds(300));
    {
      std::lock_guard lock(effects_.mutex);
      ++effects_.sent[call.request.key];
    }
    if (to == "nobody@example.com") {
      return idemsaga::Problem(422, "no_such_recipient", "no mailbox " + to);
    }
    const std::string id = "em_" + call.request.key;
    return {201,
            nlohmann::json{{"email_id", id}, {"to", to}}.dump(),
            {{"Location", "/v1/emails/" + id}}};
  }

  Effects& effects_;
  std::unique_ptr<test_support::ScratchDatabase> db_;
  std::unique_ptr<test_support::RedisServer> redis_;
  std::unique_ptr<test_support::Dynalite> dynalite_;
  std::unique_ptr<idemsaga::Participant> participant_;
  int port_ = 0;
};

std::string Email(const std::string& to) { return nlohmann::json{{"to", to}}.dump(); }

std::string Recall(const std::string& action_key, bool applied = false) {
  nlohmann::json body = {{"action_key", action_key}};
  if (applied) body["action_applied"] = true;
  return body.dump();
}

// An answer as a caller sees it: status, the headers the guard sets, and the body.
std::string Seen(const httplib::Result& r) {
  if (!r) return "no answer";
  std::string out = std::to_string(r->status);
  for (const char* h : {"Content-Type", "Idempotent-Replayed", "Retry-After", "Location"}) {
    if (r->has_header(h)) out += std::string("\n") + h + ": " + r->get_header_value(h);
  }
  return out + "\n" + r->body;
}

std::string Code(const httplib::Result& r) {
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  return body.is_object() ? body.value("code", body.value("outcome", "")) : "";
}

// The table of cases, run in order on one participant; asserts each case's invariant and
// returns every answer seen, for comparing the stores.
std::vector<std::string> RunCases(Mail& mail, Effects& effects) {
  auto c = mail.Client();
  std::vector<std::string> seen;
  auto post = [&](const std::string& path, const std::string& key, const std::string& body) {
    auto r = Post(c, path, {.key = key, .body = body});
    EXPECT_TRUE(r) << path << " " << key;
    seen.push_back(key + " " + Seen(r));
    return r;
  };

  // Applied once; every retry replays the same bytes, Location included.
  auto first = post("/v1/emails", "a-mail", Email("ann@example.com"));
  EXPECT_EQ(first->status, 201);
  EXPECT_EQ(first->get_header_value("Location"), "/v1/emails/em_a-mail");
  for (int i = 0; i < 3; ++i) {
    auto again = post("/v1/emails", "a-mail", Email("ann@example.com"));
    EXPECT_EQ(again->status, 201);
    EXPECT_EQ(again->body, first->body);
    EXPECT_EQ(again->get_header_value("Location"), "/v1/emails/em_a-mail");
    EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  }
  EXPECT_EQ(effects.Sent("a-mail"), 1);

  // The same key with another body: 422, nothing applied, nothing stored.
  auto reused = post("/v1/emails", "a-mail", Email("bob@example.com"));
  EXPECT_EQ(reused->status, 422);
  EXPECT_EQ(Code(reused), "idempotency_key_reused");
  EXPECT_EQ(effects.Sent("a-mail"), 1);

  // A business refusal is stored and replayed like a success.
  auto refused = post("/v1/emails", "b-mail", Email("nobody@example.com"));
  EXPECT_EQ(refused->status, 422);
  EXPECT_EQ(Code(refused), "no_such_recipient");
  auto refused_again = post("/v1/emails", "b-mail", Email("nobody@example.com"));
  EXPECT_EQ(refused_again->body, refused->body);
  EXPECT_EQ(refused_again->get_header_value("Idempotent-Replayed"), "true");
  EXPECT_EQ(effects.Sent("b-mail"), 1);

  // A compensation after its action undoes it once; its retry replays; the action is then
  // refused as compensated, never replayed as in effect.
  auto undone = post("/v1/emails/recall", "a-mail-compensate", Recall("a-mail"));
  EXPECT_EQ(undone->status, 200);
  EXPECT_EQ(undone->body, R"({"action_key":"a-mail","outcome":"undone","recalled":"em_a-mail"})");
  auto undone_again = post("/v1/emails/recall", "a-mail-compensate", Recall("a-mail"));
  EXPECT_EQ(undone_again->body, undone->body);
  EXPECT_EQ(undone_again->get_header_value("Idempotent-Replayed"), "true");
  // Under another compensation key: the action is undone already.
  auto other = post("/v1/emails/recall", "a-mail-compensate-2", Recall("a-mail"));
  EXPECT_EQ(Code(other), "already_undone");
  EXPECT_EQ(effects.Recalled("a-mail"), 1);
  auto late_retry = post("/v1/emails", "a-mail", Email("ann@example.com"));
  EXPECT_EQ(late_retry->status, 409);
  EXPECT_EQ(Code(late_retry), "compensated");
  EXPECT_EQ(effects.Sent("a-mail"), 1);

  // The refused action has nothing to undo.
  auto nothing = post("/v1/emails/recall", "b-mail-compensate", Recall("b-mail"));
  EXPECT_EQ(Code(nothing), "nothing_to_undo");
  EXPECT_EQ(effects.Recalled("b-mail"), 0);

  // A compensation that arrives first leaves a tombstone: the late action is refused.
  auto first_comp = post("/v1/emails/recall", "c-mail-compensate", Recall("c-mail"));
  EXPECT_EQ(first_comp->status, 200);
  EXPECT_EQ(Code(first_comp), "cancelled");
  auto late = post("/v1/emails", "c-mail", Email("cy@example.com"));
  EXPECT_EQ(late->status, 409);
  EXPECT_EQ(Code(late), "cancelled");
  EXPECT_EQ(effects.Sent("c-mail"), 0);
  EXPECT_EQ(effects.Recalled("c-mail"), 0);

  // A compensation of an action the caller saw applied, of which there is no record: 409,
  // nothing stored (no tombstone: the action is then applied if it arrives).
  auto unknown = post("/v1/emails/recall", "d-mail-compensate", Recall("d-mail", true));
  EXPECT_EQ(unknown->status, 409);
  EXPECT_EQ(Code(unknown), "action_unknown");
  EXPECT_EQ(post("/v1/emails", "d-mail", Email("di@example.com"))->status, 201);
  EXPECT_EQ(effects.Sent("d-mail"), 1);

  // Bad input: 400 naming the field, nothing applied.
  auto invalid = post("/v1/emails", "e-mail", R"({"subject":"hi"})");
  EXPECT_EQ(invalid->status, 400);
  EXPECT_EQ(effects.Sent("e-mail"), 0);
  return seen;
}

class ParticipantStoreTest : public ::testing::TestWithParam<Store> {};

TEST_P(ParticipantStoreTest, KeepsTheGuardsPromiseForEveryCase) {
  Effects effects;
  Mail mail(GetParam(), effects);
  RunCases(mail, effects);
}

TEST_P(ParticipantStoreTest, ConcurrentDuplicatesSendOnceAndTheRestReplayOrWait) {
  Effects effects;
  Mail mail(GetParam(), effects);
  constexpr int kDuplicates = 50;
  std::vector<std::string> seen(kDuplicates);
  std::vector<std::thread> threads;
  for (int i = 0; i < kDuplicates; ++i) {
    threads.emplace_back([&, i] {
      auto c = mail.Client();
      seen[i] = Seen(Post(c, "/v1/emails", {.key = "dup-mail", .body = Email("slow@example.com")}));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(effects.Sent("dup-mail"), 1);
  auto c = mail.Client();
  auto settled = Post(c, "/v1/emails", {.key = "dup-mail", .body = Email("slow@example.com")});
  ASSERT_EQ(settled->status, 201);
  for (const auto& s : seen) {
    // Either the answer (first or replayed) or 409 in progress with Retry-After.
    bool answer = s.find(settled->body) != std::string::npos;
    bool busy = s.rfind("409", 0) == 0 && s.find("Retry-After: 1") != std::string::npos &&
                s.find("idempotency_key_in_progress") != std::string::npos;
    EXPECT_TRUE(answer || busy) << s;
  }
}

// Keys a client may send: valid ones of every shape (bare tokens with punctuation, sf-strings
// with escapes, the longest accepted) and invalid ones (too long, control characters, bare
// values with quotes or separators, unterminated strings), from a fixed seed.
std::vector<std::string> GeneratedKeys(int n) {
  std::mt19937 rng(20261127);
  auto pick = [&](int below) { return static_cast<int>(rng() % static_cast<unsigned>(below)); };
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) {
    std::string k;
    const int len = 1 + (i % 10 == 0 ? 250 + pick(20) : pick(40));
    for (int j = 0; j < len; ++j) {
      int roll = pick(100);
      char c = roll < 80   ? static_cast<char>(0x21 + pick(0x5e))  // printable, no space
               : roll < 90 ? ' '
               : roll < 95 ? "\\\",;:*/"[pick(7)]
                           : static_cast<char>(1 + pick(31));  // a control character
      k.push_back(c);
    }
    if (i % 3 == 0) k = idemsaga::common::FormatIdempotencyKey(k);  // sf-string
    if (i % 17 == 0) k = "\"" + k;                                  // unterminated
    keys.push_back("g" + std::to_string(i) + "-" + k);
  }
  return keys;
}

// Bodies a client may send: valid, wrong types, not JSON, not an object, deep, huge strings.
std::vector<std::string> GeneratedBodies() {
  return {Email("ann@example.com"),
          R"({"to":42})",
          R"({"to":null})",
          "{",
          "[]",
          "\"to\"",
          "",
          std::string(2000, '['),
          R"({"to":")" + std::string(70000, 'x') + "\"}",
          R"({"to":"a@b","to":"c@d"})",
          "{\"to\":\"\xff\xfe\"}",
          R"({"to":"\u0000"})"};
}

// Every generated key and body, against every store: no answer is a 5xx; a refused request
// (4xx before the effect) calls nothing and stores nothing; an accepted key is stored and
// listed with exactly the bytes the guard's parser read from the header, once.
TEST_P(ParticipantStoreTest, HostileKeysAndBodiesGetNoFiveHundredAndStoreOnlyWhatWasAccepted) {
  Effects effects;
  Mail mail(GetParam(), effects);
  auto c = mail.Client();
  std::map<int, int> statuses;
  std::set<std::string> accepted;
  const auto keys = GeneratedKeys(1500);
  const auto bodies = GeneratedBodies();
  for (size_t i = 0; i < keys.size(); ++i) {
    // Every other request has a valid body, so that a valid key is applied.
    const std::string& body = bodies[i % 2 == 0 ? 0 : (i / 2) % bodies.size()];
    auto r = Post(c, "/v1/emails", {.key = keys[i], .body = body});
    if (!r) {
      ++statuses[0];  // the client refused to send the header (e.g. a control character)
      continue;
    }
    ++statuses[r->status];
    EXPECT_LT(r->status, 500) << keys[i] << "\n" << r->body;
    // HTTP strips a field value's trailing spaces and tabs before anyone parses it.
    std::string_view value = keys[i];
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    auto parsed = idemsaga::common::ParseIdempotencyKey(1, value, 255);
    if (r->status == 201) {
      ASSERT_TRUE(parsed.ok()) << keys[i];
      EXPECT_EQ(effects.Sent(parsed.key), 1) << keys[i];
      accepted.insert(parsed.key);
    } else if (parsed.ok()) {
      EXPECT_EQ(effects.Sent(parsed.key), 0) << keys[i] << " " << r->status;
    }
  }
  // Both kinds were generated, else the test proves nothing.
  EXPECT_GT(accepted.size(), 20U);
  EXPECT_GT(statuses[400], 100);
  std::set<std::string> listed;
  auto listing = c.Get("/v1/idempotency/keys?tenant=demo&since_seconds=3600&limit=1000",
                       {{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_TRUE(listing);
  ASSERT_EQ(listing->status, 200) << listing->body;
  const auto page = nlohmann::json::parse(listing->body);
  for (const auto& k : page["keys"]) {
    listed.insert(k["key"].get<std::string>());
  }
  EXPECT_EQ(listed, accepted);
  int sent = 0;
  for (const auto& [key, n] : effects.sent) sent += n;
  EXPECT_EQ(sent, static_cast<int>(accepted.size()));
  std::string seen;
  for (const auto& [status, n] : statuses)
    seen += " " + std::to_string(status) + "x" + std::to_string(n);
  std::cout << NameOf(GetParam()) << ": " << keys.size() << " requests," << seen << std::endl;
}

INSTANTIATE_TEST_SUITE_P(Stores, ParticipantStoreTest, ::testing::ValuesIn(kStores),
                         [](const auto& info) { return NameOf(info.param); });

// A KeyStore on its own (no HTTP), its retention 4 s.
class KeyStoreExpiry : public ::testing::TestWithParam<Store> {
 protected:
  KeyStoreExpiry() {
    namespace guard = idemsaga::steps::guard;
    const guard::GuardOptions options{.lease = std::chrono::seconds(1),
                                      .retention = std::chrono::seconds(4),
                                      .duplicates = GetParam() == Store::kPostgresFailFast
                                                        ? guard::Duplicates::kFailFast
                                                        : guard::Duplicates::kWait};
    if (GetParam() == Store::kRedis) {
      redis_server_ = std::make_unique<test_support::RedisServer>();
      redis_ = std::make_unique<idemsaga::common::redis::Pool>(
          idemsaga::common::redis::Pool::Options{.url = redis_server_->Url()});
      store_ = std::make_unique<guard::RedisGuard>(*redis_, options);
    } else if (GetParam() == Store::kDynamo) {
      dynalite_ = std::make_unique<test_support::Dynalite>();
      dynamo_ = std::make_unique<idemsaga::common::dynamo::Client>(
          idemsaga::common::dynamo::Client::FromEnvironment(dynalite_->Url()));
      auto dynamo_guard = std::make_unique<guard::DynamoGuard>(*dynamo_, "keys", options);
      dynamo_guard->EnsureTable();
      store_ = std::move(dynamo_guard);
    } else {
      db_ = std::make_unique<test_support::ScratchDatabase>("guard");
      pool_ = std::make_unique<idemsaga::common::pg::Pool>(
          idemsaga::common::pg::Pool::Options{.url = db_->url()});
      store_ = std::make_unique<guard::Guard>(*pool_, nullptr, options);
    }
  }

  idemsaga::steps::guard::Request Req(const std::string& key) {
    return {"demo", key, "POST", "/v1/emails", nlohmann::json{{"to", "ann@example.com"}}, {}};
  }
  idemsaga::steps::guard::Response Send(const std::string& key) {
    return store_->RunExternal(Req(key), [&](const idemsaga::steps::guard::ExternalCall& call) {
      std::lock_guard lock(effects_.mutex);
      ++effects_.sent[call.request.key];
      return idemsaga::steps::guard::Response{201, R"({"email_id":"em_)" + key + "\"}"};
    });
  }
  std::set<std::string> Listed() {
    std::set<std::string> out;
    for (const auto& k : store_->ListKeys("demo", std::chrono::seconds(4), "", 100)) {
      out.insert(k.key + (k.compensated ? " compensated" : ""));
    }
    return out;
  }

  Effects effects_;
  std::unique_ptr<test_support::ScratchDatabase> db_;
  std::unique_ptr<idemsaga::common::pg::Pool> pool_;
  std::unique_ptr<test_support::RedisServer> redis_server_;
  std::unique_ptr<idemsaga::common::redis::Pool> redis_;
  std::unique_ptr<test_support::Dynalite> dynalite_;
  std::unique_ptr<idemsaga::common::dynamo::Client> dynamo_;
  std::unique_ptr<idemsaga::steps::guard::KeyStore> store_;
};

// Expiry counts from a key's last write (a compensation restarts its clock), and collection
// (DeleteExpired, or Redis' own TTL) removes only keys past it: a live key keeps its answer.
// (DynamoDB's TTL is lazy and dynalite runs none: its store's reads ignore an expired item and
// DeleteExpired deletes it.)
TEST_P(KeyStoreExpiry, ExpiryCountsFromTheLastWriteAndCollectionLeavesLiveKeys) {
  using namespace std::chrono_literals;
  const auto t0 = std::chrono::steady_clock::now();
  auto a = Send("a-mail");
  ASSERT_EQ(a.status, 201);
  ASSERT_EQ(Send("b-mail").status, 201);
  std::this_thread::sleep_until(t0 + 1500ms);
  auto undone = store_->CompensateExternal(
      Req("a-mail-compensate"), "a-mail",
      [](const auto&, const auto&) { return nlohmann::json::object(); }, false);
  ASSERT_EQ(undone.status, 200) << undone.body;
  auto c = Send("c-mail");  // a key written just before collection
  ASSERT_EQ(c.status, 201);
  EXPECT_EQ(Listed(),
            (std::set<std::string>{"a-mail compensated", "a-mail-compensate", "b-mail", "c-mail"}));
  // b-mail's 4 s are over; a-mail's clock restarted at 1.5 s.
  std::this_thread::sleep_until(t0 + 4700ms);
  store_->DeleteExpired(1000);
  EXPECT_EQ(Listed(), (std::set<std::string>{"a-mail compensated", "a-mail-compensate", "c-mail"}));
  // The live keys answer as before: a-mail is compensated (refused, not sent again) and
  // c-mail replays; b-mail is forgotten, so the same key is a new request.
  auto a_late = Send("a-mail");
  EXPECT_EQ(a_late.status, 409);
  EXPECT_EQ(a_late.outcome, idemsaga::steps::protocol::Outcome::kCompensated);
  auto c_again = Send("c-mail");
  EXPECT_TRUE(c_again.replayed);
  EXPECT_EQ(c_again.body, c.body);
  EXPECT_EQ(Send("b-mail").status, 201);
  EXPECT_EQ(effects_.Sent("a-mail"), 1);
  EXPECT_EQ(effects_.Sent("c-mail"), 1);
  EXPECT_EQ(effects_.Sent("b-mail"), 2);
}

INSTANTIATE_TEST_SUITE_P(Stores, KeyStoreExpiry, ::testing::ValuesIn(kStores),
                         [](const auto& info) { return NameOf(info.param); });

// What a participant serves besides its routes, with what varies by the clock taken out.
std::string Served(Mail& mail, const std::string& path) {
  auto c = mail.Client();
  auto r = c.Get(path.c_str(), {{"Authorization", std::string("Bearer ") + kToken}});
  if (!r) return "no answer";
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  if (body.is_object() && body.contains("keys")) {
    for (auto& k : body["keys"]) k.erase("age_seconds");
  }
  return std::to_string(r->status) + "\n" + (body.is_discarded() ? r->body : body.dump());
}

TEST(ParticipantStores, AnswerTheSameBytesOnEveryStore) {
  Effects pg_effects;
  Mail on_pg(Store::kPostgres, pg_effects);
  auto pg = RunCases(on_pg, pg_effects);
  for (Store store : {Store::kPostgresFailFast, Store::kRedis, Store::kDynamo}) {
    Effects effects;
    Mail other(store, effects);
    auto seen = RunCases(other, effects);
    ASSERT_EQ(seen.size(), pg.size()) << NameOf(store);
    for (size_t i = 0; i < pg.size(); ++i) EXPECT_EQ(seen[i], pg[i]) << NameOf(store) << " " << i;
    EXPECT_EQ(effects.sent, pg_effects.sent) << NameOf(store);
    EXPECT_EQ(effects.recalled, pg_effects.recalled) << NameOf(store);
    for (const char* path :
         {"/v1/idempotency", "/v1/idempotency/keys?tenant=demo&since_seconds=3600", "/metrics"}) {
      EXPECT_EQ(Served(other, path), Served(on_pg, path)) << NameOf(store) << " " << path;
    }
  }
}

// docs/participants.md's "Keys in Redis" example (readme_test compares the two).
std::atomic<int> emails_sent{0}, emails_recalled{0};

std::string ValidateEmail(const nlohmann::json& body) {
  return body.contains("to") && body["to"].is_string() ? "" : "to is required";
}

idemsaga::Response SendEmail(const idemsaga::ExternalCall& call) {
  ++emails_sent;  // the provider's API, called with the key (call.request.key)
  return {201, nlohmann::json{{"email_id", "em_" + call.request.key}}.dump()};
}

nlohmann::json RecallEmail(const idemsaga::ExternalCall&, const idemsaga::ActionRecord& sent) {
  ++emails_recalled;
  return {{"recalled", sent.body.value("email_id", "")}};
}

// [redis-participant]
std::unique_ptr<idemsaga::Participant> MailOnRedis(const std::string& redis_url,
                                                   const std::string& token) {
  auto mail = std::make_unique<idemsaga::Participant>(idemsaga::ParticipantServiceOptions{
      .name = "mail", .service_token = token, .redis_url = redis_url});
  mail->ExternalAction("/v1/emails", ValidateEmail, SendEmail)
      .ExternalCompensation("/v1/emails/recall", RecallEmail);
  return mail;
}
// [redis-participant]

TEST(ParticipantStores, TheDocsExampleSendsOnceAndRecallsOnce) {
  test_support::RedisServer redis;
  auto mail = MailOnRedis(redis.Url(), kToken);
  httplib::Client c("127.0.0.1", mail->Start("127.0.0.1", 0));
  auto first = Post(c, "/v1/emails", {.key = "A-mail", .body = Email("ann@example.com")});
  auto again = Post(c, "/v1/emails", {.key = "A-mail", .body = Email("ann@example.com")});
  ASSERT_EQ(first->status, 201);
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(emails_sent, 1);
  for (int i = 0; i < 2; ++i) {
    auto recall =
        Post(c, "/v1/emails/recall", {.key = "A-mail-compensate", .body = Recall("A-mail")});
    EXPECT_EQ(recall->body, R"({"action_key":"A-mail","outcome":"undone","recalled":"em_A-mail"})");
  }
  EXPECT_EQ(emails_recalled, 1);
}

// A library participant on PostgreSQL deletes its expired keys on a schedule, as the stock
// ones do; a live key stays. (Redis and DynamoDB expire theirs: KeyStoreExpiry.)
TEST(ParticipantStores, APostgresParticipantCollectsExpiredKeysAndKeepsLiveOnes) {
  test_support::ScratchDatabase db("guard");
  idemsaga::Participant mail({.name = "mail",
                              .database_url = db.url(),
                              .service_token = kToken,
                              .gc_interval = std::chrono::milliseconds(200)});
  mail.ExternalAction("/v1/emails", ValidateEmail, SendEmail);
  httplib::Client c("127.0.0.1", mail.Start("127.0.0.1", 0));
  for (const char* key : {"old-1", "old-2", "live"}) {
    ASSERT_EQ(Post(c, "/v1/emails", {.key = key, .body = Email("ann@example.com")})->status, 201);
  }
  db.Exec(
      "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' "
      "WHERE idempotency_key LIKE 'old-%'");
  for (int i = 0; i < 100 && db.Count("SELECT count(*) FROM idempotency_keys") > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(db.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'live'"), 1);
  EXPECT_EQ(db.Count("SELECT count(*) FROM idempotency_keys"), 1);
}

TEST(ParticipantStores, RefusesAnActionInSqlOnRedisAtStartNamingTheRoute) {
  idemsaga::Participant p(
      {.name = "hotel", .service_token = kToken, .redis_url = "redis://127.0.0.1:1"});
  p.Action("/v1/bookings", nullptr,
           [](pqxx::work&, const idemsaga::Request&) { return idemsaga::Response{}; });
  try {
    p.Start("127.0.0.1", 0);
    FAIL() << "started";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Action /v1/bookings is PostgreSQL-only"),
              std::string::npos)
        << e.what();
  }
  idemsaga::Participant with_schema(
      {.name = "hotel", .service_token = kToken, .redis_url = "redis://127.0.0.1:1"});
  with_schema.Schema("CREATE TABLE IF NOT EXISTS bookings (id text)");
  EXPECT_THROW(with_schema.Start("127.0.0.1", 0), std::invalid_argument);
}

// On DynamoDB as on Redis: SQL routes, a store with no URL, and an unknown store are refused
// before anything starts, naming what to change.
TEST(ParticipantStores, RefusesWhatDynamoDbCannotServeAtStart) {
  auto start_error = [](idemsaga::ParticipantServiceOptions options,
                        bool with_action) -> std::string {
    options.name = "hotel";
    options.service_token = kToken;
    idemsaga::Participant p(options);
    if (with_action) {
      p.Action("/v1/bookings", nullptr,
               [](pqxx::work&, const idemsaga::Request&) { return idemsaga::Response{}; });
    }
    try {
      p.Start("127.0.0.1", 0);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "started";
  };
  EXPECT_NE(start_error({.store = "dynamodb", .dynamodb_url = "http://127.0.0.1:1"}, true)
                .find("Action /v1/bookings is PostgreSQL-only"),
            std::string::npos);
  EXPECT_NE(start_error({.store = "dynamodb"}, false).find("needs a DynamoDB URL"),
            std::string::npos);
  EXPECT_NE(start_error({.store = "mongo"}, false).find("postgres, redis or dynamodb"),
            std::string::npos);
}

TEST(ParticipantStores, RefusesARedisThatWouldForgetKeys) {
  test_support::RedisServer redis({.appendfsync = "everysec"});
  idemsaga::Participant p(
      {.name = "mail", .service_token = kToken, .redis_url = redis.Url(), .redis_fsync = "always"});
  try {
    p.Start("127.0.0.1", 0);
    FAIL() << "started";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("appendfsync"), std::string::npos) << e.what();
  }
}

}  // namespace
