#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "common/http/server.hpp"
#include "common/pg/errors.hpp"
#include "common/unavailable.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using idemsaga::steps::guard::ActionRecord;
using idemsaga::steps::guard::EffectScope;
using idemsaga::steps::guard::Guard;
using idemsaga::steps::guard::Request;
using idemsaga::steps::guard::Response;
using test_support::ScratchDatabase;

// A participant database plus a table of effects, so tests count what really happened. Every
// test runs under both effect scopes: what is stored and answered must not depend on it.
class GuardTest : public ::testing::TestWithParam<EffectScope> {
 protected:
  GuardTest() : db_("payment"), pool_({.url = db_.url(), .size = 64}), guard_(pool_) {
    db_.Exec(
        "CREATE TABLE effects (tenant_id text, key text, undone boolean NOT NULL DEFAULT false)");
  }

  Request Req(std::string key, nlohmann::json body = {{"amount", 1}}, std::string tenant = "demo") {
    return Request{std::move(tenant), std::move(key), "POST", "/v1/things", std::move(body)};
  }

  // Records one effect row and answers with a body unique to this execution.
  Guard::Effect RecordEffect(int status = 201) {
    return [this, status](pqxx::work& tx) {
      tx.exec_params("INSERT INTO effects (tenant_id, key) VALUES ($1, $2)", "t", "k");
      ++runs_;
      auto id = tx.exec("SELECT gen_random_uuid()::text")[0][0].as<std::string>();
      return Response{status, nlohmann::json{{"id", id}}.dump()};
    };
  }

  Guard::Undo CountUndo() {
    return [this](pqxx::work& tx, const ActionRecord&) {
      tx.exec("UPDATE effects SET undone = true");
      ++undos_;
      return nlohmann::json{{"undone_here", true}};
    };
  }

  long long Effects() { return db_.Count("SELECT count(*) FROM effects"); }

  Response Run(const Request& req, const Guard::Effect& effect) {
    return guard_.Run(req, effect, GetParam());
  }

  // Whether an effect is called only for a key it owns (a transaction-only effect may be
  // called and rolled back; what it wrote is counted in `effects` either way).
  static bool CalledOnlyWhenOwned() { return GetParam() == EffectScope::kAny; }

  ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
  Guard guard_;
  std::atomic<int> runs_{0};
  std::atomic<int> undos_{0};
};

TEST_P(GuardTest, FirstRequestRunsTheEffectOnce) {
  auto res = Run(Req("A-payment"), RecordEffect());
  EXPECT_EQ(res.status, 201);
  EXPECT_FALSE(res.replayed);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"), 1);
}

TEST_P(GuardTest, ReplayIsByteIdenticalAndMarkedAndRunsNothing) {
  auto first = Run(Req("A-payment"), RecordEffect());
  auto again = Run(Req("A-payment"), RecordEffect());
  EXPECT_EQ(again.status, first.status);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.content_type, first.content_type);
  EXPECT_TRUE(again.replayed);
  if (CalledOnlyWhenOwned()) {
    EXPECT_EQ(runs_, 1);
  }
  EXPECT_EQ(Effects(), 1);
}

TEST_P(GuardTest, SameKeyWithAnotherBodyIs422AndChangesNothing) {
  auto first = Run(Req("A-payment", {{"amount", 1}}), RecordEffect());
  auto reused = Run(Req("A-payment", {{"amount", 2}}), RecordEffect());
  EXPECT_EQ(reused.status, 422);
  EXPECT_NE(reused.body.find("idempotency_key_reused"), std::string::npos);
  EXPECT_EQ(Effects(), 1);
  // The stored answer is untouched: the original request still replays it.
  EXPECT_EQ(Run(Req("A-payment", {{"amount", 1}}), RecordEffect()).body, first.body);
}

TEST_P(GuardTest, FiftyConcurrentDuplicatesRunTheEffectOnceAndAllGetTheSameBody) {
  constexpr int kThreads = 50;
  std::vector<Response> answers(kThreads);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  auto slow_effect = [this](pqxx::work& tx) {
    tx.exec("SELECT pg_sleep(0.2)");  // hold the key so the others pile up on it
    return RecordEffect()(tx);
  };
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      answers[i] = Run(Req("storm-payment"), slow_effect);
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(Effects(), 1);
  if (CalledOnlyWhenOwned()) {
    EXPECT_EQ(runs_, 1);
  }
  std::set<std::string> bodies;
  int replays = 0;
  for (const auto& a : answers) {
    EXPECT_EQ(a.status, 201);
    bodies.insert(a.body);
    replays += a.replayed ? 1 : 0;
  }
  EXPECT_EQ(bodies.size(), 1u);
  EXPECT_EQ(replays, kThreads - 1);
}

// Past its race attempts (a key neither claimed nor found, as when its claimant keeps rolling
// back) the guard gives up; the guard's route answers that as an outage, through a real
// server: 503, Retry-After, the outage's problem body, nothing stored, and the retry with the
// same key, once the race is over, applies the effect once. A trigger that drops the claim's
// insert makes every attempt race.
TEST_P(GuardTest, AClaimThatKeepsRacingIsA503WithRetryAfterAndTheRetryIsSafe) {
  db_.KeyClaimsKeepRacing(true);
  idemsaga::steps::guard::HttpGuard http(guard_, {.service_token = "token"});
  idemsaga::common::http::Server server({}, idemsaga::common::pg::Classify);
  server.Post("/v1/things",
              http.Action([](const nlohmann::json&) { return std::string(); },
                          [this](pqxx::work& tx, const Request&) { return RecordEffect()(tx); },
                          GetParam()));
  const int port = server.Bind("127.0.0.1", 0);
  std::thread serving([&] { server.Serve(); });
  httplib::Client client("127.0.0.1", port);
  const httplib::Headers headers = {{"Authorization", "Bearer token"},
                                    {"X-Tenant-ID", "demo"},
                                    {"Idempotency-Key", "raced-payment"}};
  auto raced = client.Post("/v1/things", headers, R"({"amount":1})", "application/json");
  // What the route answered from: our own outage, not a library's exception made up for it.
  EXPECT_THROW(Run(Req("raced-payment"), RecordEffect()), idemsaga::common::Unavailable);
  db_.KeyClaimsKeepRacing(false);
  auto retried = client.Post("/v1/things", headers, R"({"amount":1})", "application/json");
  server.Stop();
  serving.join();

  test_support::ExpectOutageAnswer(raced);
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->status, 201) << retried->body;
  EXPECT_EQ(Effects(), 1);  // the raced attempts' effects rolled back
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"), 1);
}

TEST_P(GuardTest, AStoredBusinessFailureIsReplayedWithoutRunningAgain) {
  auto declined = Run(Req("B-payment"), [](pqxx::work&) {
    return idemsaga::steps::guard::Problem(402, "card_declined", "the card was declined");
  });
  auto again = Run(Req("B-payment"), RecordEffect());
  EXPECT_EQ(again.status, 402);
  EXPECT_EQ(again.body, declined.body);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(Effects(), 0);
}

TEST_P(GuardTest, ATransientFailureStoresNothingAndTheRetryRuns) {
  EXPECT_THROW(Run(Req("C-payment"),
                   [](pqxx::work& tx) -> Response {
                     tx.exec("INSERT INTO effects (tenant_id, key) VALUES ('t', 'k')");
                     throw std::runtime_error("participant crashed mid-effect");
                   }),
               std::runtime_error);
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  auto retry = Run(Req("C-payment"), RecordEffect());
  EXPECT_EQ(retry.status, 201);
  EXPECT_FALSE(retry.replayed);
  EXPECT_EQ(Effects(), 1);
}

TEST_P(GuardTest, AConnectionLostMidEffectStoresNothingAndTheRetryRuns) {
  EXPECT_ANY_THROW(Run(Req("D-payment"), [](pqxx::work& tx) -> Response {
    tx.exec("INSERT INTO effects (tenant_id, key) VALUES ('t', 'k')");
    tx.exec("SELECT pg_terminate_backend(pg_backend_pid())");
    return Response{201, "{}"};
  }));
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(Run(Req("D-payment"), RecordEffect()).status, 201);
  EXPECT_EQ(Effects(), 1);
}

TEST_P(GuardTest, SameKeyInTwoTenantsGivesTwoIndependentEffects) {
  auto demo = Run(Req("A-payment", {{"amount", 1}}, "demo"), RecordEffect());
  auto acme = Run(Req("A-payment", {{"amount", 1}}, "acme"), RecordEffect());
  EXPECT_FALSE(acme.replayed);
  EXPECT_NE(demo.body, acme.body);
  EXPECT_EQ(Effects(), 2);
}

TEST_P(GuardTest, CompensationUndoesACompletedActionExactlyOnce) {
  Run(Req("A-payment"), RecordEffect());
  auto comp = Req("A-payment-compensate", {{"action_key", "A-payment"}});
  auto first = guard_.Compensate(comp, "A-payment", CountUndo());
  auto again = guard_.Compensate(comp, "A-payment", CountUndo());
  auto other_key = guard_.Compensate(Req("A-payment-compensate-2", {{"action_key", "A-payment"}}),
                                     "A-payment", CountUndo());
  EXPECT_EQ(undos_, 1);
  EXPECT_EQ(nlohmann::json::parse(first.body)["outcome"], "undone");
  EXPECT_EQ(again.body, first.body);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(nlohmann::json::parse(other_key.body)["outcome"], "already_undone");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects WHERE undone"), 1);
}

TEST_P(GuardTest, CompensationBeforeTheActionLeavesATombstoneThatRefusesTheLateAction) {
  auto comp = guard_.Compensate(Req("E-payment-compensate", {{"action_key", "E-payment"}}),
                                "E-payment", CountUndo());
  EXPECT_EQ(nlohmann::json::parse(comp.body)["outcome"], "cancelled");
  auto late = Run(Req("E-payment"), RecordEffect());
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(nlohmann::json::parse(late.body)["code"], "cancelled");
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(undos_, 0);
}

TEST_P(GuardTest, CompensatingAFailedActionHasNothingToUndo) {
  Run(Req("F-payment"), [](pqxx::work&) {
    return idemsaga::steps::guard::Problem(402, "card_declined", "declined");
  });
  auto comp = guard_.Compensate(Req("F-payment-compensate", {{"action_key", "F-payment"}}),
                                "F-payment", CountUndo());
  EXPECT_EQ(nlohmann::json::parse(comp.body)["outcome"], "nothing_to_undo");
  EXPECT_EQ(undos_, 0);
}

TEST_P(GuardTest, ATombstoneIsPerTenant) {
  guard_.Compensate(Req("G-payment-compensate", {{"action_key", "G-payment"}}, "demo"), "G-payment",
                    CountUndo());
  auto other_tenant = Run(Req("G-payment", {{"amount", 1}}, "acme"), RecordEffect());
  EXPECT_EQ(other_tenant.status, 201);
  EXPECT_EQ(Effects(), 1);
}

// A late retry of an undone action (its parent key collected and claimed again) must hear that
// it was undone: replaying its old 201 would report a refunded charge as in place.
TEST_P(GuardTest, AnActionUndoneByItsCompensationAnswersCompensatedNeverItsOldSuccess) {
  auto first = Run(Req("A-payment"), RecordEffect());
  ASSERT_EQ(first.status, 201);
  auto undo = guard_.Compensate(Req("A-payment-compensate", {{"action_key", "A-payment"}}),
                                "A-payment", CountUndo());
  ASSERT_EQ(nlohmann::json::parse(undo.body)["outcome"], "undone");
  auto late = Run(Req("A-payment"), RecordEffect());
  EXPECT_EQ(late.status, 409);
  EXPECT_FALSE(late.replayed);
  EXPECT_EQ(nlohmann::json::parse(late.body)["code"], "compensated");
  if (CalledOnlyWhenOwned()) {
    EXPECT_EQ(runs_, 1);
  }
  EXPECT_EQ(undos_, 1);
  // Another body under the key is still a reuse, whatever became of the action.
  EXPECT_EQ(Run(Req("A-payment", {{"amount", 9}}), RecordEffect()).status, 422);
}

// Retention is the guard's option, counted from the claim, and from the compensation for an
// undone action; GC deletes a key only once it is past that, to the second.
TEST_P(GuardTest, KeysAreKeptForTheRetentionAndAnUndoneActionForARetentionFromItsUndo) {
  Guard guard(pool_, nullptr, {.retention = std::chrono::hours(10)});
  ASSERT_EQ(guard.Run(Req("B-payment"), RecordEffect()).status, 201);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE expires_at BETWEEN "
                      "created_at + interval '10 hours' - interval '5 seconds' AND created_at + "
                      "interval '10 hours' + interval '5 seconds'"),
            1);
  // The boundary: a minute before expiry it stays; just past it, it goes.
  db_.Exec("UPDATE idempotency_keys SET expires_at = now() + interval '1 minute'");
  EXPECT_EQ(guard.DeleteExpired(100), 0);
  // An action near its expiry is undone: it now lives a full retention from the undo.
  ASSERT_EQ(nlohmann::json::parse(
                guard
                    .Compensate(Req("B-payment-compensate", {{"action_key", "B-payment"}}),
                                "B-payment", CountUndo())
                    .body)["outcome"],
            "undone");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 'B-payment' "
                      "AND expires_at > now() + interval '9 hours'"),
            1);
  db_.Exec("UPDATE idempotency_keys SET expires_at = now() - interval '1 millisecond'");
  EXPECT_EQ(guard.DeleteExpired(100), 2);
  // Past retention the guard cannot tell "never arrived" from "forgotten": a compensation
  // answers `cancelled`, which the orchestrator refuses to count as undone for an action that
  // answered 2xx (see the client and the orders test of that case). Hence the start-up check.
  auto after = guard.Compensate(Req("B-payment-compensate-2", {{"action_key", "B-payment"}}),
                                "B-payment", CountUndo());
  EXPECT_EQ(nlohmann::json::parse(after.body)["outcome"], "cancelled");
  EXPECT_EQ(undos_, 1);
}

// A stuck saga re-drives its steps (and retries its compensations) for as long as it takes:
// every use of a key past half its retention keeps it another full retention.
TEST_P(GuardTest, AKeyStillInUseIsKeptAliveByItsReplaysAndOnlyThen) {
  Guard guard(pool_, nullptr, {.retention = std::chrono::hours(10)});
  ASSERT_EQ(guard.Run(Req("K-payment"), RecordEffect()).status, 201);
  auto expiry = [&] {
    return db_.Count("SELECT extract(epoch FROM expires_at - now())::bigint FROM idempotency_keys");
  };
  auto fresh = expiry();
  guard.Run(Req("K-payment"), RecordEffect());  // a replay of a fresh key writes nothing
  EXPECT_LE(expiry(), fresh);
  db_.Exec("UPDATE idempotency_keys SET expires_at = now() + interval '1 minute'");
  EXPECT_TRUE(guard.Run(Req("K-payment"), RecordEffect()).replayed);
  EXPECT_GT(expiry(), 9 * 3600);
  if (CalledOnlyWhenOwned()) {
    EXPECT_EQ(runs_, 1);
  }
}

// The caller saw the action succeed, yet there is no record of it (collected, or a backup
// restored): the answer says so and stores nothing, no tombstone, so that the retry after the
// record is back undoes it.
TEST_P(GuardTest, ACompensationOfAnActionKnownToHaveSucceededButMissingStoresNothing) {
  auto lost = guard_.Compensate(
      Req("L-payment-compensate", {{"action_key", "L-payment"}, {"action_applied", true}}),
      "L-payment", CountUndo(), /*action_applied=*/true);
  EXPECT_EQ(lost.status, 409);
  EXPECT_EQ(nlohmann::json::parse(lost.body)["code"], "action_unknown");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys"), 0);
  // The record comes back (here: the action is applied now); the same compensation undoes it.
  ASSERT_EQ(Run(Req("L-payment"), RecordEffect()).status, 201);
  auto undone = guard_.Compensate(
      Req("L-payment-compensate", {{"action_key", "L-payment"}, {"action_applied", true}}),
      "L-payment", CountUndo(), /*action_applied=*/true);
  EXPECT_EQ(nlohmann::json::parse(undone.body)["outcome"], "undone");
  EXPECT_EQ(undos_, 1);
}

TEST_P(GuardTest, ATransactionOnlyEffectWritesTheKeyRowOnce) {
  ASSERT_EQ(Run(Req("W-payment"), RecordEffect()).status, 201);
  // A fresh table: the first row version is item 1 of page 0; claimed then updated, the row
  // moved on to item 2.
  EXPECT_EQ(db_.Count("SELECT (ctid::text::point)[1]::bigint FROM idempotency_keys"),
            GetParam() == EffectScope::kTransactionOnly ? 1 : 2);
}

TEST_P(GuardTest, AnEffectThatTripsOnItsOwnUniqueIndexIsStillReplayed) {
  db_.Exec("CREATE TABLE own_charges (tenant_id text, key text, UNIQUE (tenant_id, key))");
  auto charge = [](pqxx::work& tx) {
    tx.exec_params("INSERT INTO own_charges VALUES ($1, $2)", "demo", "U-payment");
    auto id = tx.exec("SELECT gen_random_uuid()::text")[0][0].as<std::string>();
    return Response{201, nlohmann::json{{"id", id}}.dump()};
  };
  auto first = Run(Req("U-payment"), charge);
  auto again = Run(Req("U-payment"), charge);
  EXPECT_EQ(again.status, 201);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM own_charges"), 1);
}

// The headers a handler names (a created resource's Location) come back with every replay, as
// do Content-Type and the body; a refusal stored without any replays without any.
TEST_P(GuardTest, TheHeadersTheHandlerNamesAreStoredAndReplayed) {
  auto created = [](pqxx::work& tx) {
    auto id = tx.exec("SELECT gen_random_uuid()::text")[0][0].as<std::string>();
    Response res{201, nlohmann::json{{"id", id}}.dump(), "application/vnd.things+json"};
    res.headers = {{"Location", "/v1/things/" + id}, {"X-Thing-Version", "3"}};
    return res;
  };
  auto first = Run(Req("H-payment"), created);
  auto again = Run(Req("H-payment"), created);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(again.content_type, "application/vnd.things+json");
  EXPECT_EQ(again.headers, first.headers);
  EXPECT_EQ(again.headers.at("Location"),
            "/v1/things/" + nlohmann::json::parse(first.body)["id"].get<std::string>());
  auto refused = Run(Req("H2-payment"), [](pqxx::work&) {
    return idemsaga::steps::guard::Problem(402, "card_declined", "declined");
  });
  EXPECT_TRUE(Run(Req("H2-payment"), RecordEffect()).headers.empty());
  EXPECT_TRUE(refused.headers.empty());
}

// Duplicates::kFailFast against kWait: while one request holds a key (its effect is running),
// duplicates under fail-fast are answered 409 in_progress without ever waiting on a lock in
// PostgreSQL (sampled from pg_stat_activity); under wait they sit on the unique index. The
// effect runs once either way.
const auto kBothPolicies = ::testing::Values(idemsaga::steps::guard::Duplicates::kWait,
                                             idemsaga::steps::guard::Duplicates::kFailFast);
std::string PolicyName(const ::testing::TestParamInfo<idemsaga::steps::guard::Duplicates>& info) {
  return info.param == idemsaga::steps::guard::Duplicates::kWait ? "Wait" : "FailFast";
}

class DuplicatesTest : public ::testing::TestWithParam<idemsaga::steps::guard::Duplicates> {
 protected:
  DuplicatesTest()
      : db_("payment"),
        pool_({.url = db_.url(), .size = 32}),
        guard_(pool_, nullptr, {.duplicates = GetParam()}) {
    db_.Exec("CREATE TABLE effects (key text)");
  }
  ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
  Guard guard_;
};

TEST_P(DuplicatesTest, DuplicatesOfAKeyInFlightWaitOrFailFastAndTheEffectRunsOnce) {
  const bool fail_fast = GetParam() == idemsaga::steps::guard::Duplicates::kFailFast;
  std::promise<void> entered, release;
  auto released = release.get_future().share();
  Request req{"demo", "held-payment", "POST", "/v1/charges", {{"amount", 1}}};
  auto effect = [&](pqxx::work& tx) {
    tx.exec_params("INSERT INTO effects (key) VALUES ($1)", "held-payment");
    entered.set_value();
    released.wait();
    return Response{201, R"({"id":"ch_1"})"};
  };
  Response first;
  std::thread holder([&] { first = guard_.Run(req, effect, EffectScope::kAny); });
  entered.get_future().wait();

  constexpr int kDuplicates = 12;
  std::vector<Response> answers(kDuplicates);
  std::vector<double> latency_ms(kDuplicates);
  std::atomic<int> done{0};
  std::vector<std::thread> duplicates;
  auto storm_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kDuplicates; ++i) {
    duplicates.emplace_back([&, i] {
      auto sent = std::chrono::steady_clock::now();
      answers[i] = guard_.Run(req, [](pqxx::work&) -> Response {
        throw std::logic_error("a duplicate must never run the effect");
      });
      latency_ms[i] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent)
              .count();
      ++done;
    });
  }
  // While they are answered, count sessions of this database waiting on a lock.
  int lock_waits_seen = 0;
  while (done < kDuplicates) {
    lock_waits_seen = std::max<int>(
        lock_waits_seen,
        static_cast<int>(db_.Count("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                   "current_database() AND wait_event_type = 'Lock'")));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& t : duplicates) t.join();
  auto answered_in = std::chrono::steady_clock::now() - storm_start;
  std::sort(latency_ms.begin(), latency_ms.end());
  // Each duplicate is a thread (a server's worker) and a pooled connection for its latency.
  std::cout << "duplicates=" << (fail_fast ? "fail-fast" : "wait") << " requests=" << kDuplicates
            << " most_sessions_waiting_on_a_lock=" << lock_waits_seen
            << " p50_ms=" << latency_ms[kDuplicates / 2] << " max_ms=" << latency_ms.back()
            << " all_answered_in_ms="
            << std::chrono::duration_cast<std::chrono::milliseconds>(answered_in).count()
            << std::endl;
  release.set_value();
  holder.join();

  for (const auto& a : answers) {
    EXPECT_EQ(a.status, 409) << a.body;
    EXPECT_EQ(a.outcome, idemsaga::steps::protocol::Outcome::kInProgress);
    EXPECT_NE(a.body.find("idempotency_key_in_progress"), std::string::npos);
  }
  if (fail_fast) {
    EXPECT_EQ(lock_waits_seen, 0);
  } else {
    EXPECT_GT(lock_waits_seen, 0);  // the instrument sees waiting when there is some
  }
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects"), 1);
  // Once the holder committed, a duplicate replays its answer in both modes.
  auto later = guard_.Run(req, [](pqxx::work&) -> Response { throw std::logic_error("ran"); });
  EXPECT_TRUE(later.replayed);
  EXPECT_EQ(later.body, first.body);
}

// Replays of a finished key hold the key only for their read: in either mode, concurrent
// replays are all answered from what is stored, never 409 because another replay was reading.
TEST_P(DuplicatesTest, ConcurrentReplaysOfAFinishedKeyAreAllReplayed) {
  Request req{"demo", "done-payment", "POST", "/v1/charges", {{"amount", 1}}};
  auto effect = [&](pqxx::work& tx) {
    tx.exec_params("INSERT INTO effects (key) VALUES ($1)", req.key);
    return Response{201, R"({"id":"ch_2"})"};
  };
  ASSERT_EQ(guard_.Run(req, effect, EffectScope::kTransactionOnly).status, 201);
  constexpr int kThreads = 16, kEach = 40;
  std::atomic<int> replayed{0}, other{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        auto a = guard_.Run(req, effect, EffectScope::kTransactionOnly);
        (a.status == 201 && a.replayed && a.body == R"({"id":"ch_2"})" ? replayed : other)++;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(replayed, kThreads * kEach);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects"), 1);
}

INSTANTIATE_TEST_SUITE_P(Modes, DuplicatesTest, kBothPolicies, PolicyName);

INSTANTIATE_TEST_SUITE_P(Scopes, GuardTest,
                         ::testing::Values(EffectScope::kAny, EffectScope::kTransactionOnly),
                         [](const auto& info) {
                           return info.param == EffectScope::kAny ? std::string("Any")
                                                                  : std::string("TransactionOnly");
                         });

// Guard::RunPlanned: a new key's answer, its effect and the key commit in one statement; every
// other case is answered as Run answers it. Under both duplicate policies.
class PlannedTest : public DuplicatesTest {
 protected:
  PlannedTest() {
    db_.Exec("ALTER TABLE effects ADD COLUMN tenant_id text, ADD COLUMN id text, ADD UNIQUE (key)");
  }

  static Request Req(std::string key, nlohmann::json body = {{"amount", 1}}) {
    return Request{"demo", std::move(key), "POST", "/v1/things", std::move(body)};
  }

  // The caller makes the id, so the answer is known before the effect runs.
  static idemsaga::steps::guard::PlannedEffect Plan(const Request& req, const std::string& id) {
    return {Response{201, nlohmann::json{{"id", id}}.dump()},
            "INSERT INTO effects (tenant_id, key, id) SELECT $1, $2, $3 FROM claimed",
            {req.tenant_id, req.key, id}};
  }

  long long Effects() { return db_.Count("SELECT count(*) FROM effects"); }
  long long Keys() { return db_.Count("SELECT count(*) FROM idempotency_keys"); }
  // Stored answers that name the effect recorded under their own key.
  long long AnswersNamingTheirEffect() {
    return db_.Count(
        "SELECT count(*) FROM effects e JOIN idempotency_keys k ON k.idempotency_key = e.key "
        "AND k.response_body = '{\"id\":\"' || e.id || '\"}'");
  }
};

TEST_P(PlannedTest, ANewKeyAppliesTheEffectOnceAndItsAnswerIsReplayedByteForByte) {
  auto req = Req("P-payment");
  auto first = guard_.RunPlanned(req, Plan(req, "id-1"));
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.replayed);
  EXPECT_EQ(first.outcome, idemsaga::steps::protocol::Outcome::kApplied);
  EXPECT_EQ(first.body, R"({"id":"id-1"})");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects WHERE id = 'id-1' AND key = 'P-payment'"), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed' AND "
                      "response_body = '{\"id\":\"id-1\"}' AND response_status = 201"),
            1);
  // A retry plans again (a new id): the stored answer wins, and nothing is applied.
  auto again = guard_.RunPlanned(req, Plan(req, "id-2"));
  EXPECT_EQ(again.status, 201);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(Keys(), 1);
}

TEST_P(PlannedTest, TheSameKeyWithAnotherBodyIs422AndAppliesNothing) {
  auto req = Req("Q-payment");
  guard_.RunPlanned(req, Plan(req, "id-1"));
  auto other = Req("Q-payment", {{"amount", 2}});
  auto reused = guard_.RunPlanned(other, Plan(other, "id-2"));
  EXPECT_EQ(reused.status, 422);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects WHERE id = 'id-2'"), 0);
}

TEST_P(PlannedTest, ARefusalPlannedWithoutAStatementStoresOnlyItsAnswer) {
  auto req = Req("R-payment");
  idemsaga::steps::guard::PlannedEffect refusal{
      Response{402, R"({"code":"card_declined"})"}, "", {}};
  auto first = guard_.RunPlanned(req, refusal);
  EXPECT_EQ(first.status, 402);
  EXPECT_FALSE(first.replayed);
  auto again = guard_.RunPlanned(req, Plan(req, "id-1"));  // a retry may not apply it after all
  EXPECT_EQ(again.status, 402);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(Effects(), 0);
}

TEST_P(PlannedTest, ThirtyTwoConcurrentDuplicatesApplyTheEffectOnceAndShareOneAnswer) {
  auto req = Req("S-payment");
  std::vector<std::future<Response>> answers;
  for (int i = 0; i < 32; ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      return guard_.RunPlanned(req, Plan(req, "id-" + std::to_string(i)));
    }));
  }
  std::set<std::string> bodies;
  int applied = 0, in_progress = 0;
  for (auto& a : answers) {
    auto res = a.get();
    if (res.status == 409) {  // fail-fast: a duplicate that met the first one in flight
      ++in_progress;
      continue;
    }
    ASSERT_EQ(res.status, 201) << res.body;
    bodies.insert(res.body);
    applied += res.replayed ? 0 : 1;
  }
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(bodies.size(), 1u);
  if (GetParam() == idemsaga::steps::guard::Duplicates::kWait) {
    EXPECT_EQ(in_progress, 0);
  }
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(Keys(), 1);
  EXPECT_EQ(AnswersNamingTheirEffect(), 1);
}

// The key is gone (collected) but the effect it guarded is not: the effect's own unique index
// trips in the one statement and again in Run's transaction, which throws; nothing is stored.
TEST_P(PlannedTest, AnEffectThatTripsOnItsOwnUniqueIndexStoresNothing) {
  auto req = Req("T-payment");
  guard_.RunPlanned(req, Plan(req, "id-1"));
  db_.Exec("DELETE FROM idempotency_keys");
  EXPECT_THROW(guard_.RunPlanned(req, Plan(req, "id-2")), pqxx::unique_violation);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(Keys(), 0);
}

TEST_P(PlannedTest, ACompensationThatCameFirstRefusesThePlannedActionAndNothingIsApplied) {
  Request comp{
      "demo", "U-payment-compensate", "POST", "/v1/refunds", {{"action_key", "U-payment"}}};
  auto cancelled = guard_.Compensate(
      comp, "U-payment", [](pqxx::work&, const ActionRecord&) { return nlohmann::json::object(); });
  EXPECT_EQ(nlohmann::json::parse(cancelled.body)["outcome"], "cancelled");
  auto req = Req("U-payment");
  auto late = guard_.RunPlanned(req, Plan(req, "id-1"));
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(nlohmann::json::parse(late.body)["code"], "cancelled");
  EXPECT_EQ(Effects(), 0);
}

// The guard's parameters follow the plan's: SQL that uses more than it passes (or fewer), or
// that is not gated by `claimed`, is refused before anything runs.
TEST_P(PlannedTest, APlanWhoseSqlDoesNotMatchItsParametersOrIgnoresClaimedRunsNothing) {
  auto req = Req("V-payment");
  auto plan = Plan(req, "id-1");
  plan.params.pop_back();  // $3 would be the guard's tenant
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  plan = Plan(req, "id-1");
  plan.params.push_back("extra");
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  plan = Plan(req, "id-1");
  plan.sql = "INSERT INTO effects (tenant_id, key, id) VALUES ($1, $2, $3)";
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(Keys(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, PlannedTest, kBothPolicies, PolicyName);

// A plan that may find nothing to do: it takes one of a limited number of units, in `ctes`,
// and records the effect from what it took. When no unit is left, nothing is stored and
// `otherwise` (counted) decides in Run's transaction.
class ConditionalPlanTest : public PlannedTest {
 protected:
  // No unique index on the effect here: the key's INSERT is all that stops a second take.
  ConditionalPlanTest() {
    db_.Exec("CREATE TABLE units (n int NOT NULL CHECK (n >= 0))");
    db_.Exec("ALTER TABLE effects DROP CONSTRAINT effects_key_key");
  }

  void SetUnits(int n) {
    db_.Exec("DELETE FROM units");
    db_.Exec("INSERT INTO units VALUES (" + std::to_string(n) + ")");
  }
  long long Units() { return db_.Count("SELECT n FROM units"); }

  idemsaga::steps::guard::PlannedEffect Take(const Request& req, const std::string& id) {
    idemsaga::steps::guard::PlannedEffect plan = Plan(req, id);
    plan.ctes =
        "taken AS (UPDATE units SET n = n - 1 WHERE n >= 1 AND EXISTS (SELECT 1 FROM "
        "claimed) RETURNING n)";
    plan.sql = "INSERT INTO effects (tenant_id, key, id) SELECT $1, $2, $3 FROM taken RETURNING 1";
    plan.otherwise = [this, id, req](pqxx::work& tx) {
      ++otherwise_;
      if (tx.exec("UPDATE units SET n = n - 1 WHERE n >= 1 RETURNING n").empty()) {
        return Response{409, R"({"code":"none_left"})"};
      }
      tx.exec_params("INSERT INTO effects (tenant_id, key, id) VALUES ($1, $2, $3)", req.tenant_id,
                     req.key, id);
      return Response{201, nlohmann::json{{"id", id}}.dump()};
    };
    return plan;
  }

  std::atomic<int> otherwise_{0};
};

TEST_P(ConditionalPlanTest, APlanThatFindsItsUnitAppliesOnceAndIsReplayedWithoutOtherwise) {
  SetUnits(5);
  auto req = Req("C-stock");
  auto first = guard_.RunPlanned(req, Take(req, "id-1"));
  EXPECT_EQ(first.status, 201);
  EXPECT_FALSE(first.replayed);
  EXPECT_EQ(first.body, R"({"id":"id-1"})");
  auto again = guard_.RunPlanned(req, Take(req, "id-2"));
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(Units(), 4);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM effects WHERE id = 'id-1'"), 1);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(Keys(), 1);
  // Fail-fast runs the plan as Run's effect from the start: `otherwise` decides there.
  EXPECT_EQ(otherwise_, GetParam() == idemsaga::steps::guard::Duplicates::kWait ? 0 : 1);
}

TEST_P(ConditionalPlanTest, APlanThatFindsNothingStoresNothingAndOtherwiseAnswersOnce) {
  SetUnits(0);
  auto req = Req("D-stock");
  auto first = guard_.RunPlanned(req, Take(req, "id-1"));
  EXPECT_EQ(first.status, 409);
  EXPECT_EQ(first.body, R"({"code":"none_left"})");
  EXPECT_EQ(otherwise_, 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE response_status = 409"), 1);
  SetUnits(1);  // stock came back: the stored refusal still stands for this key
  auto again = guard_.RunPlanned(req, Take(req, "id-2"));
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.body, first.body);
  EXPECT_EQ(otherwise_, 1);
  EXPECT_EQ(Units(), 1);
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(Keys(), 1);
}

// Duplicates race the one statement. Here they are lined up to lose that race: the units
// row is held while they start, so every one finds the key free and then waits for the unit;
// the first commits, and each later one takes its unit before its key's INSERT trips on the
// first's key, a unique violation that gives the unit back. (Under fail-fast only the
// request holding the key waits; the others are refused at once.)
TEST_P(ConditionalPlanTest, DuplicatesThatFoundTheKeyFreeTakeOneUnitBetweenThem) {
  const bool fail_fast = GetParam() == idemsaga::steps::guard::Duplicates::kFailFast;
  SetUnits(100);
  auto req = Req("E-stock");
  pqxx::connection holder(db_.url());
  pqxx::work hold(holder);
  hold.exec("SELECT n FROM units FOR UPDATE");
  constexpr int kDuplicates = 16;
  std::vector<std::future<Response>> answers;
  for (int i = 0; i < kDuplicates; ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      return guard_.RunPlanned(req, Take(req, "id-" + std::to_string(i)));
    }));
  }
  const long long lined_up = fail_fast ? 1 : kDuplicates;
  auto waiting = [&] {
    return db_.Count(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'");
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (waiting() < lined_up && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(waiting(), lined_up) << "the duplicates did not line up behind the held row";
  if (fail_fast) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the refusals
  hold.commit();
  std::set<std::string> bodies;
  int applied = 0;
  for (auto& a : answers) {
    auto res = a.get();
    if (res.status == 409 && fail_fast) continue;  // refused while the first was in flight
    ASSERT_EQ(res.status, 201) << res.body;
    bodies.insert(res.body);
    applied += res.replayed ? 0 : 1;
  }
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(bodies.size(), 1u);
  // The planned path applied it, and every loser was answered from the key; under fail-fast
  // the one request that claimed the key ran `otherwise`.
  EXPECT_EQ(otherwise_, fail_fast ? 1 : 0);
  EXPECT_EQ(Units(), 99);
  EXPECT_EQ(Effects(), 1);
  EXPECT_EQ(Keys(), 1);
  EXPECT_EQ(AnswersNamingTheirEffect(), 1);
}

// Forty keys for ten units: exactly ten take one, each answer names its own effect, and the
// other thirty store the refusal; no unit is taken twice or lost.
TEST_P(ConditionalPlanTest, FortyKeysForTenUnitsTakeExactlyTen) {
  SetUnits(10);
  std::vector<std::future<Response>> answers;
  for (int i = 0; i < 40; ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto req = Req("F" + std::to_string(i) + "-stock");
      return guard_.RunPlanned(req, Take(req, "id-" + std::to_string(i)));
    }));
  }
  int taken = 0, refused = 0;
  for (auto& a : answers) {
    auto res = a.get();
    if (res.status == 201) ++taken;
    if (res.status == 409 && res.body == R"({"code":"none_left"})") ++refused;
  }
  EXPECT_EQ(taken, 10);
  EXPECT_EQ(refused, 30);
  // Ten planned statements took a unit; the thirty that found none were decided by
  // `otherwise`, once each. Fail-fast runs every one through `otherwise`.
  EXPECT_EQ(otherwise_, GetParam() == idemsaga::steps::guard::Duplicates::kWait ? 30 : 40);
  EXPECT_EQ(Units(), 0);
  EXPECT_EQ(Effects(), 10);
  EXPECT_EQ(Keys(), 40);
  EXPECT_EQ(AnswersNamingTheirEffect(), 10);
}

TEST_P(ConditionalPlanTest, AConditionalPlanWithoutReturningOrWithCtesAndNoSqlRunsNothing) {
  SetUnits(5);
  auto req = Req("G-stock");
  auto plan = Take(req, "id-1");
  plan.sql = "INSERT INTO effects (tenant_id, key, id) SELECT $1, $2, $3 FROM taken";
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  plan = Take(req, "id-1");
  plan.sql.clear();
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  plan = Take(req, "id-1");
  plan.ctes =
      "taken AS (UPDATE units SET n = n - $4 WHERE EXISTS (SELECT 1 FROM claimed) "
      "RETURNING n)";  // $4 would be the guard's tenant
  EXPECT_THROW(guard_.RunPlanned(req, plan), std::invalid_argument);
  EXPECT_EQ(Units(), 5);
  EXPECT_EQ(Effects(), 0);
  EXPECT_EQ(Keys(), 0);
  EXPECT_EQ(otherwise_, 0);
}

// With `otherwise` and nothing planned, RunPlanned is Run with `otherwise`.
TEST_P(ConditionalPlanTest, AnUnplannedRequestIsAnsweredByOtherwise) {
  SetUnits(5);
  auto req = Req("H-stock");
  idemsaga::steps::guard::PlannedEffect plan = Take(req, "id-1");
  plan.sql.clear();
  plan.ctes.clear();
  plan.params.clear();
  auto first = guard_.RunPlanned(req, plan);
  EXPECT_EQ(first.status, 201);
  EXPECT_EQ(guard_.RunPlanned(req, plan).body, first.body);
  EXPECT_EQ(otherwise_, 1);
  EXPECT_EQ(Units(), 4);
  EXPECT_EQ(Effects(), 1);
}

INSTANTIATE_TEST_SUITE_P(Policies, ConditionalPlanTest, kBothPolicies, PolicyName);

}  // namespace
