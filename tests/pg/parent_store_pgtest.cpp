#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include "common/crypto.hpp"
#include "common/unavailable.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/span_store.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::orchestrator::store::Claim;
using idemsaga::orchestrator::store::ClaimRequest;
using idemsaga::orchestrator::store::ParentStore;
using idemsaga::orchestrator::store::SpanStore;
using test_support::ScratchDatabase;

// A stored batch of one span named `name`, as SQL.
std::string SpanJson(const std::string& name) {
  return "'[{\"span_id\":\"3333333333333333\",\"parent_span_id\":\"\",\"service\":"
         "\"orchestrator\",\"name\":\"" +
         name +
         "\",\"kind\":1,\"start_unix_nano\":0,\"end_unix_nano\":1,\"status\":\"ok\","
         "\"status_message\":\"\",\"attributes\":{}}]'::json";
}

// A store that runs `on_conflict` when a claim finds its key taken, before it reads the key:
// the window another claim (or garbage collection) can race.
class RacingStore : public ParentStore {
 public:
  RacingStore(idemsaga::common::pg::Pool& pool, std::function<void()> on_conflict)
      : ParentStore(pool, {}), on_conflict_(std::move(on_conflict)) {}

 protected:
  void OnClaimConflict() override { on_conflict_(); }

 private:
  std::function<void()> on_conflict_;
};

class ParentStoreTest : public ::testing::Test {
 protected:
  ParentStoreTest()
      : db_("orchestrator"),
        pool_({.url = db_.url(), .size = 4}),
        store_(pool_, {}),
        spans_(pool_) {
    store_.UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
    store_.UpsertTenant("acme", idemsaga::common::Sha256Hex("dev-key-acme"));
  }
  ClaimRequest Req(std::string key, std::string owner = "owner-a", std::string body = "1",
                   std::string tenant = "demo") {
    // Each key its own trace, as when no caller sends a traceparent.
    return {tenant,
            key,
            idemsaga::common::Sha256Hex(body),
            {{"n", body}},
            "place_order",
            1,
            owner,
            idemsaga::common::Sha256Hex(tenant + key).substr(0, 32)};
  }
  void ExpireLease(const std::string& key) {
    db_.Exec(
        "UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = $1",
        key);
  }
  // One garbage-collection batch as Recovery runs it: the keys, then their traces' spans.
  long long CollectExpired() {
    auto gone = store_.DeleteExpired(1000);
    spans_.DeleteForTraces(gone.trace_ids);
    return gone.keys;
  }
  ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
  ParentStore store_;
  SpanStore spans_;
};

TEST_F(ParentStoreTest, TheFirstRequestClaimsTheKeyWithALease) {
  auto c = store_.ClaimKey(Req("A"));
  EXPECT_EQ(c.kind, Claim::kClaimed);
  EXPECT_EQ(c.lease.epoch, 1);
  EXPECT_EQ(c.row.status, idemsaga::orchestrator::store::SagaStatus::kStarted);
  EXPECT_TRUE(c.row.lease_live);
  EXPECT_EQ(c.row.order_id.rfind("ord_", 0), 0u);
}

// An order id is "ord_", the claim's milliseconds since the epoch in 12 hex digits, then 20
// random ones: new orders' index entries land beside each other, however many rows the table
// holds, and ids sort by the millisecond they were claimed in.
TEST_F(ParentStoreTest, OrderIdsBeginWithTheClaimsMillisecond) {
  auto ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  std::set<std::string> tails;
  std::string last;
  for (int i = 0; i < 20; ++i) {
    long long before = ms();
    auto id = store_.ClaimKey(Req("ids-" + std::to_string(i))).row.order_id;
    long long after = ms();
    ASSERT_EQ(id.size(), 36u) << id;
    ASSERT_EQ(id.rfind("ord_", 0), 0u) << id;
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
    long long at = std::stoll(id.substr(4, 12), nullptr, 16);
    // The database's clock and ours: the same machine; a few ms of slack for the round trip.
    EXPECT_GE(at, before - 5) << id;
    EXPECT_LE(at, after + 5) << id;
    EXPECT_GE(id.substr(4, 12), last);  // claimed one after another: their milliseconds sorted
    last = id.substr(4, 12);
    tails.insert(id.substr(16));
  }
  EXPECT_EQ(tails.size(), 20u);  // the random part differs
}

TEST_F(ParentStoreTest, ARetryWhileTheLeaseIsLiveIsInProgress) {
  store_.ClaimKey(Req("A"));
  auto again = store_.ClaimKey(Req("A", "owner-b"));
  EXPECT_EQ(again.kind, Claim::kInProgress);
  EXPECT_GT(again.row.lease_seconds_left, 0);
}

TEST_F(ParentStoreTest, TheSameKeyWithAnotherBodyIsAMismatch) {
  store_.ClaimKey(Req("A"));
  EXPECT_EQ(store_.ClaimKey(Req("A", "owner-a", "2")).kind, Claim::kMismatch);
}

TEST_F(ParentStoreTest, AFinishedKeyReplaysItsStoredResponse) {
  auto c = store_.ClaimKey(Req("A"));
  ASSERT_TRUE(
      store_.Finish(c.lease, true, 201, R"({"status":"completed"})", nlohmann::json::array()));
  auto again = store_.ClaimKey(Req("A", "owner-b"));
  EXPECT_EQ(again.kind, Claim::kFinished);
  EXPECT_EQ(again.row.response_status, 201);
  EXPECT_EQ(again.row.response_body, R"({"status":"completed"})");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE lease_owner IS NULL"), 1);
}

TEST_F(ParentStoreTest, AnExpiredLeaseIsTakenOverWithANewEpoch) {
  auto first = store_.ClaimKey(Req("A"));
  ExpireLease("A");
  auto second = store_.ClaimKey(Req("A", "owner-b"));
  EXPECT_EQ(second.kind, Claim::kTakenOver);
  EXPECT_EQ(second.lease.epoch, first.lease.epoch + 1);
  EXPECT_EQ(second.row.lease_owner, "owner-b");
}

TEST_F(ParentStoreTest, AStaleOwnerCannotWriteAfterATakeover) {
  auto stale = store_.ClaimKey(Req("A"));
  ExpireLease("A");
  auto fresh = store_.ClaimKey(Req("A", "owner-b"));
  ASSERT_EQ(fresh.kind, Claim::kTakenOver);
  EXPECT_FALSE(store_.Renew(stale.lease));
  EXPECT_FALSE(store_.BeginCompensation(stale.lease, nlohmann::json::array(), "payment", {}));
  EXPECT_FALSE(store_.Finish(stale.lease, true, 201, "{}", nlohmann::json::array()));
  EXPECT_EQ(store_.fenced_writes(), 3);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'started'"), 1);
  EXPECT_TRUE(store_.Finish(fresh.lease, true, 201, "{}", nlohmann::json::array()));
}

TEST_F(ParentStoreTest, OnlyOneOfTwoProcessesTakesOverAnExpiredLease) {
  store_.ClaimKey(Req("A"));
  ExpireLease("A");
  auto b = store_.TakeOverExpired("demo", "A", "owner-b");
  auto c = store_.TakeOverExpired("demo", "A", "owner-c");
  EXPECT_TRUE(b.has_value());
  EXPECT_FALSE(c.has_value());
}

TEST_F(ParentStoreTest, TheDecisionToCompensateIsDurableAndVisible) {
  auto c = store_.ClaimKey(Req("A"));
  nlohmann::json steps = {{{"name", "inventory"}, {"status", "compensating"}}};
  ASSERT_TRUE(store_.BeginCompensation(c.lease, steps, "payment",
                                       {{"outcome", "terminal"}, {"http_status", 402}}));
  auto row = store_.Get("demo", "A");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->status, idemsaga::orchestrator::store::SagaStatus::kCompensating);
  EXPECT_EQ(row->failed_step, "payment");
  ASSERT_EQ(row->steps.size(), 1u);  // read into its type once, here
  EXPECT_EQ(row->steps[0].name, "inventory");
  EXPECT_EQ(row->steps[0].status, idemsaga::steps::saga::StepStatus::kCompensating);
  EXPECT_TRUE(row->unreadable_steps.empty());
  ASSERT_TRUE(row->failure);
  EXPECT_EQ(row->failure->outcome, idemsaga::Outcome::kTerminal);
  EXPECT_EQ(row->failure->http_status, 402);
}

// A record this build cannot read (a newer build's status) is kept as stored, in its place,
// and written back unchanged: nothing of it is lost to a guess.
TEST_F(ParentStoreTest, AStepRecordThisBuildCannotReadIsKeptAsStoredInItsPlace) {
  auto c = store_.ClaimKey(Req("A"));
  idemsaga::steps::saga::StepRecord readable;
  readable.name = "inventory";
  readable.action_key = "A-inventory";
  readable.status = idemsaga::steps::saga::StepStatus::kCompensating;
  readable.attempts = 1;
  nlohmann::json newer = {{"name", "payment"}, {"status", "from_a_newer_build"}, {"x", 1}};
  nlohmann::json steps = {readable.ToJson(), newer};
  ASSERT_TRUE(store_.BeginCompensation(c.lease, steps, "payment", nullptr));
  auto row = store_.Get("demo", "A");
  ASSERT_TRUE(row);
  ASSERT_EQ(row->steps.size(), 2u);
  EXPECT_EQ(row->steps[0].name, "inventory");
  EXPECT_EQ(row->steps[0].status, idemsaga::steps::saga::StepStatus::kCompensating);
  ASSERT_EQ(row->unreadable_steps.size(), 1u);
  EXPECT_EQ(row->unreadable_steps.at(1).stored, newer);
  EXPECT_NE(row->unreadable_steps.at(1).why.find("from_a_newer_build"), std::string::npos);
  EXPECT_FALSE(row->failure);  // none stored
  ASSERT_TRUE(store_.DeferStuck(c.lease, StepsColumn(*row), std::chrono::hours(1)));
  EXPECT_EQ(
      db_.Count("SELECT count(*) FROM idempotency_keys WHERE steps = $1::jsonb", steps.dump()), 1);
}

// A damaged failure column (a newer build's, a hand edit) leaves the row readable, as an
// unreadable step does: listing it or a take-over batch must not throw, and nothing resumes it.
TEST_F(ParentStoreTest, AFailureThisBuildCannotReadLeavesTheRowReadableButNotResumable) {
  auto c = store_.ClaimKey(Req("A"));
  nlohmann::json steps = {{{"name", "inventory"}, {"status", "compensating"}}};
  ASSERT_TRUE(store_.BeginCompensation(c.lease, steps, "payment",
                                       {{"outcome", "terminal"}, {"http_status", "x"}}));
  std::optional<idemsaga::orchestrator::store::SagaRow> row;
  ASSERT_NO_THROW(row = store_.Get("demo", "A"));
  ASSERT_TRUE(row);
  EXPECT_FALSE(row->failure);
  ASSERT_TRUE(row->UnreadableWhy());
  EXPECT_NE(row->UnreadableWhy()->find("failure"), std::string::npos);
  EXPECT_EQ(row->steps.size(), 1u);
}

TEST_F(ParentStoreTest, KeysAreScopedByTenant) {
  auto demo = store_.ClaimKey(Req("A"));
  auto acme = store_.ClaimKey(Req("A", "owner-a", "1", "acme"));
  EXPECT_EQ(acme.kind, Claim::kClaimed);
  EXPECT_NE(acme.row.order_id, demo.row.order_id);
  EXPECT_FALSE(store_.Get("acme", "B").has_value());
}

TEST_F(ParentStoreTest, TenantsAreFoundByTheHashOfTheirApiKey) {
  EXPECT_EQ(store_.TenantForKeyHash(idemsaga::common::Sha256Hex("dev-key-demo")), "demo");
  EXPECT_FALSE(store_.TenantForKeyHash(idemsaga::common::Sha256Hex("nope")).has_value());
  EXPECT_EQ(db_.Count("SELECT count(*) FROM tenants WHERE api_key_hash LIKE '%dev-key%'"), 0);
}

}  // namespace

namespace {

TEST_F(ParentStoreTest, ConcurrentSweepersTakeOverDisjointSagas) {
  for (int i = 0; i < 40; ++i) store_.ClaimKey(Req("k" + std::to_string(i)));
  db_.Exec("UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second'");
  std::vector<idemsaga::orchestrator::store::Claim> a, b;
  std::thread ta([&] { a = store_.TakeOverExpiredBatch("sweeper-a", 30); });
  std::thread tb([&] { b = store_.TakeOverExpiredBatch("sweeper-b", 30); });
  ta.join();
  tb.join();
  std::set<std::string> keys;
  for (const auto& c : a) keys.insert(c.row.key);
  for (const auto& c : b) EXPECT_TRUE(keys.insert(c.row.key).second) << c.row.key << " twice";
  EXPECT_EQ(keys.size(), 40u);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE lease_epoch = 2"), 40);
}

TEST_F(ParentStoreTest, ASweepLeavesLiveLeasesAndFinishedSagasAlone) {
  store_.ClaimKey(Req("live"));
  auto done = store_.ClaimKey(Req("done"));
  store_.Finish(done.lease, true, 201, "{}", nlohmann::json::array());
  EXPECT_TRUE(store_.TakeOverExpiredBatch("sweeper", 10).empty());
}

TEST_F(ParentStoreTest, ADeferredStuckSagaIsVisibleAndComesBackWhenItsLeaseRunsOut) {
  auto c = store_.ClaimKey(Req("stuck"));
  ASSERT_TRUE(store_.BeginCompensation(c.lease, nlohmann::json::array(), "payment", {}));
  ASSERT_TRUE(store_.DeferStuck(c.lease, nlohmann::json::array(), std::chrono::milliseconds(200)));
  auto listed =
      store_.List("demo", idemsaga::orchestrator::store::SagaStatus::kCompensating, true, 10);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].stuck);
  EXPECT_TRUE(store_.TakeOverExpiredBatch("sweeper", 10).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto taken = store_.TakeOverExpiredBatch("sweeper", 10);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].row.status, idemsaga::orchestrator::store::SagaStatus::kCompensating);
  // The new owner is retrying it now; it shows as stuck again if that fails again.
  EXPECT_EQ(store_.CountRunning().stuck, 0);
}

TEST_F(ParentStoreTest, RetryNowNeverExpiresTheLeaseOfASagaAnotherReplicaTookOver) {
  auto c = store_.ClaimKey(Req("stuck"));
  ASSERT_TRUE(store_.DeferStuck(c.lease, nlohmann::json::array(), std::chrono::milliseconds(0)));
  ExpireLease("stuck");
  auto taken = store_.TakeOverExpired("demo", "stuck", "replica-b");
  ASSERT_TRUE(taken.has_value());
  EXPECT_FALSE(store_.RetryNow("demo", "stuck")) << "replica-b is running it right now";
  auto row = store_.Get("demo", "stuck");
  EXPECT_TRUE(row->lease_live);
  EXPECT_EQ(row->lease_owner, "replica-b");
  EXPECT_FALSE(row->stuck);
}

TEST_F(ParentStoreTest, AFinishedSagaIsKeptForTheRetentionCountedFromItsEnd) {
  auto c = store_.ClaimKey(Req("long"));
  // The saga ran (or was stuck) for longer than the retention: its claim-time expiry passed.
  db_.Exec("UPDATE idempotency_keys SET expires_at = now() - interval '1 hour'");
  ASSERT_TRUE(store_.Finish(c.lease, false, 502, "{}", nlohmann::json::array()));
  EXPECT_EQ(store_.DeleteExpired(1000).keys, 0) << "a just-finished answer must be replayable";
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE expires_at > now() + "
                      "interval '23 hours'"),
            1);
}

// A key another process is claiming right now: the claim waits for it, then reads and answers
// from the winner's row (here: in progress), never claims a second time; when the winner rolls
// back, the claim is this request's.
TEST_F(ParentStoreTest, AClaimThatLosesARaceAnswersFromTheWinnersRow) {
  for (bool winner_commits : {true, false}) {
    std::string key = winner_commits ? "race-commit" : "race-rollback";
    pqxx::connection winner_conn(db_.url());
    pqxx::work winner(winner_conn);
    winner.exec_params(
        "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body, "
        "saga_name, order_id, status, lease_owner, lease_epoch, lease_expires_at, trace_id, "
        "expires_at) VALUES ('demo', $1, $2, '{\"n\":\"1\"}', 'place_order', $3, 'started', "
        "'winner', 1, now() + interval '1 minute', $4, now() + interval '1 day')",
        key, idemsaga::common::Sha256Hex("1"), "ord_" + key,
        idemsaga::common::Sha256Hex("demo" + key).substr(0, 32));
    int raced = 0;
    RacingStore loser(pool_, [&] { ++raced; });
    std::optional<Claim> claim;
    std::thread t([&] { claim = loser.ClaimKey(Req(key)); });  // waits on the uncommitted row
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (winner_commits) {
      winner.commit();
    } else {
      winner.abort();
    }
    t.join();
    ASSERT_TRUE(claim);
    if (winner_commits) {
      EXPECT_EQ(raced, 1);
      EXPECT_EQ(claim->kind, Claim::kInProgress);
      EXPECT_EQ(claim->row.lease_owner, "winner");
    } else {
      EXPECT_EQ(raced, 0);
      EXPECT_EQ(claim->kind, Claim::kClaimed);
      EXPECT_EQ(claim->row.lease_owner, "owner-a");
    }
    EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1", key),
              1);
  }
}

// A key found taken, then deleted (garbage collection) before it is read: the claim tries
// again and owns the key, rather than answering from a row that is gone.
TEST_F(ParentStoreTest, AKeyGoneBetweenTheClaimAndItsReadIsClaimedAgain) {
  store_.ClaimKey(Req("gone"));
  int conflicts = 0;
  RacingStore again(pool_, [&] {
    if (++conflicts == 1) db_.Exec("DELETE FROM idempotency_keys");
  });
  auto claim = again.ClaimKey(Req("gone", "owner-b"));
  EXPECT_EQ(conflicts, 1);
  EXPECT_EQ(claim.kind, Claim::kClaimed);
  EXPECT_EQ(claim.row.lease_owner, "owner-b");
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE lease_owner = 'owner-b'"), 1);
}

// The row a claim answers is the row it stored, though it reads back only what the database
// chose.
TEST_F(ParentStoreTest, AClaimAnswersTheRowItStored) {
  auto req = Req("fresh");
  req.request_body = {{"zeta", 1}, {"a", {1.5, "x", nullptr}}, {"big", 12345678901234567ULL}};
  req.root_span_id = "4f1944ae2eeb8b6e";
  auto claim = store_.ClaimKey(req);
  ASSERT_EQ(claim.kind, Claim::kClaimed);
  auto stored = store_.Get("demo", "fresh");
  ASSERT_TRUE(stored);
  const idemsaga::orchestrator::store::SagaRow& a = claim.row;
  const idemsaga::orchestrator::store::SagaRow& b = *stored;
  EXPECT_EQ(std::tie(a.tenant_id, a.key, a.request_hash, a.saga_name, a.saga_version, a.order_id,
                     a.lease_owner, a.lease_epoch, a.lease_live, a.failed_step, a.stuck,
                     a.response_status, a.response_body, a.trace_id, a.created_at, a.updated_at,
                     a.root_span_id),
            std::tie(b.tenant_id, b.key, b.request_hash, b.saga_name, b.saga_version, b.order_id,
                     b.lease_owner, b.lease_epoch, b.lease_live, b.failed_step, b.stuck,
                     b.response_status, b.response_body, b.trace_id, b.created_at, b.updated_at,
                     b.root_span_id));
  EXPECT_EQ(a.status, b.status);
  using Row = idemsaga::orchestrator::store::SagaRow;
  for (nlohmann::json Row::*field :
       {&Row::request_body, &Row::response_headers, &Row::cancel_requested, &Row::resolution}) {
    EXPECT_EQ(a.*field, b.*field);
  }
  EXPECT_EQ(StepsColumn(a), StepsColumn(b));
  EXPECT_EQ(a.failure.has_value(), b.failure.has_value());
  EXPECT_NEAR(a.lease_seconds_left, b.lease_seconds_left, 5);
  EXPECT_NEAR(a.expires_in_seconds, b.expires_in_seconds, 5);
}

TEST_F(ParentStoreTest, RetryNowExpiresOnlyAStuckSagasLease) {
  auto c = store_.ClaimKey(Req("stuck"));
  EXPECT_FALSE(store_.RetryNow("demo", "stuck"));  // running normally: not retryable
  store_.DeferStuck(c.lease, nlohmann::json::array(), std::chrono::hours(1));
  EXPECT_FALSE(store_.RetryNow("acme", "stuck"));  // another tenant's key
  EXPECT_TRUE(store_.RetryNow("demo", "stuck"));
  EXPECT_EQ(store_.TakeOverExpiredBatch("sweeper", 10).size(), 1u);
}

TEST_F(ParentStoreTest, ReleasingLeasesOnShutdownLetsAnotherReplicaResumeAtOnce) {
  store_.ClaimKey(Req("a", "leaving"));
  store_.ClaimKey(Req("b", "staying"));
  EXPECT_EQ(store_.ReleaseLeases("leaving"), 1);
  auto taken = store_.TakeOverExpiredBatch("other", 10);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].row.key, "a");
}

// A claim that keeps racing (a trigger drops its insert: never claimed, never found) gives up
// with our own outage, which every edge answers 503 + Retry-After (orders_itest checks the
// answer), never a library's exception made up for it; nothing is claimed.
TEST_F(ParentStoreTest, AClaimThatKeepsRacingGivesUpAsAnOutageItsEdgesAnswer) {
  db_.KeyClaimsKeepRacing(true);
  EXPECT_THROW(store_.ClaimKey(Req("raced")), idemsaga::common::Unavailable);
  EXPECT_FALSE(store_.Get("demo", "raced").has_value());
}

TEST_F(ParentStoreTest, GarbageCollectionDeletesOnlyFinishedKeysPastRetention) {
  for (const char* k : {"old-done", "new-done", "old-running"}) store_.ClaimKey(Req(k));
  for (const char* k : {"old-done", "new-done"}) {
    auto row = store_.Get("demo", k);
    store_.Finish({"demo", k, "owner-a", row->lease_epoch}, true, 201, "{}",
                  nlohmann::json::array());
  }
  db_.Exec(
      "UPDATE idempotency_keys SET expires_at = now() - interval '1 hour' "
      "WHERE idempotency_key LIKE 'old-%'");
  auto span_of = [&](const std::string& key) {
    db_.Exec("INSERT INTO trace_spans (trace_id, spans) SELECT trace_id, " + SpanJson("x") +
                 " FROM idempotency_keys WHERE idempotency_key = $1",
             key);
  };
  span_of("old-done");
  span_of("new-done");
  const std::string new_trace = store_.Get("demo", "new-done")->trace_id;
  EXPECT_EQ(CollectExpired(), 1);
  EXPECT_FALSE(store_.Get("demo", "old-done").has_value());
  // The old key's trace went with it; the kept key's spans stay.
  EXPECT_EQ(db_.Count("SELECT count(*) FROM spans"), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM spans WHERE trace_id = $1", new_trace), 1);
  EXPECT_TRUE(store_.Get("demo", "new-done").has_value());
  EXPECT_TRUE(store_.Get("demo", "old-running").has_value());  // never while running
}

TEST_F(ParentStoreTest, ATraceSharedWithAnotherKeyKeepsItsSpans) {
  auto shared = Req("old-done");
  auto other = Req("other");
  other.trace_id = shared.trace_id;  // a caller sent one traceparent for both orders
  auto c = store_.ClaimKey(shared);
  store_.ClaimKey(other);
  store_.Finish(c.lease, true, 201, "{}", nlohmann::json::array());
  db_.Exec("INSERT INTO trace_spans (trace_id, spans) VALUES ($1, " + SpanJson("x") + ")",
           shared.trace_id);
  db_.Exec(
      "UPDATE idempotency_keys SET expires_at = now() - interval '1 hour' "
      "WHERE idempotency_key = 'old-done'");
  EXPECT_EQ(CollectExpired(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM spans"), 1);
}

TEST_F(ParentStoreTest, SpansNoKeyAccountsForAreDeletedAfterTheRetention) {
  db_.Exec("INSERT INTO trace_spans (trace_id, spans, received_at) VALUES (repeat('a', 32), " +
           SpanJson("refused") + ", now() - interval '25 hours'), (repeat('b', 32), " +
           SpanJson("recent") + ", now())");
  EXPECT_EQ(spans_.DeleteUnowned(std::chrono::hours(24), 1000), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM spans WHERE name = 'recent'"), 1);
}

// Until autovacuum first analyses the table (a minute or more after a deploy, thousands of
// orders), the planner knows nothing of it. An index that led with tenant_id then looked as
// good as the primary key, and the cached plans of the claim and the finish took it: each read
// every key of the tenant (measured: 1,356 index entries a claim after 3,000 orders).
TEST_F(ParentStoreTest, BeforeTheFirstAnalyzeASingleKeyStatementUsesOnlyThePrimaryKey) {
  for (int i = 0; i < 300; ++i) {
    auto c = store_.ClaimKey(Req("k" + std::to_string(i)));
    if (i % 2 == 0) store_.Finish(c.lease, true, 201, "{}", nlohmann::json::array());
  }
  pqxx::connection conn(db_.url());
  pqxx::nontransaction tx(conn);
  ASSERT_EQ(
      tx.exec1("SELECT reltuples FROM pg_class WHERE relname = 'idempotency_keys'")[0].as<double>(),
      -1)
      << "the table must never have been analysed";
  tx.exec0("SET plan_cache_mode = force_generic_plan");
  // The shapes of the claim's read, the finish (and renew, defer, takeover) and retry-now.
  const std::vector<std::pair<std::string, std::string>> shapes = {
      {"SELECT * FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2",
       "('demo', 'k1')"},
      {"UPDATE idempotency_keys SET updated_at = now() WHERE tenant_id = $1 AND "
       "idempotency_key = $2 AND lease_owner = $3 AND status NOT IN ('completed', 'failed')",
       "('demo', 'k1', 'owner-a')"},
      {"UPDATE idempotency_keys SET updated_at = now() WHERE tenant_id = $1 AND "
       "idempotency_key = $2 AND status NOT IN ('completed', 'failed') AND stuck",
       "('demo', 'k1')"},
  };
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const std::string name = "shape" + std::to_string(i);
    tx.exec0("PREPARE " + name + " AS " + shapes[i].first);
    std::string plan;
    for (const auto& row : tx.exec("EXPLAIN EXECUTE " + name + shapes[i].second)) {
      plan += row[0].as<std::string>() + "\n";
    }
    EXPECT_NE(plan.find("idempotency_keys_pkey"), std::string::npos) << shapes[i].first << "\n"
                                                                     << plan;
  }
}

TEST_F(ParentStoreTest, TheListingMergesRunningAndFinishedSagasNewestFirst) {
  for (int i = 0; i < 6; ++i) {
    auto c = store_.ClaimKey(Req("k" + std::to_string(i)));
    db_.Exec(
        "UPDATE idempotency_keys SET created_at = now() - make_interval(secs => $1) "
        "WHERE idempotency_key = $2",
        100 - i, "k" + std::to_string(i));
    if (i % 2 == 1) store_.Finish(c.lease, i != 5, 201, "{}", nlohmann::json::array());
  }
  store_.ClaimKey(Req("other", "owner-a", "1", "acme"));
  auto keys = [&](const std::string& status, int limit) {
    std::string out;
    auto filter =
        status.empty() ? std::nullopt : idemsaga::orchestrator::store::ParseSagaStatus(status);
    for (const auto& row : store_.List("demo", filter, false, limit)) out += row.key + " ";
    return out;
  };
  EXPECT_EQ(keys("", 10), "k5 k4 k3 k2 k1 k0 ");
  EXPECT_EQ(keys("", 3), "k5 k4 k3 ");
  EXPECT_EQ(keys("started", 10), "k4 k2 k0 ");
  EXPECT_EQ(keys("completed", 10), "k3 k1 ");
  EXPECT_EQ(keys("failed", 10), "k5 ");
  EXPECT_EQ(keys("compensating", 10), "");
}

}  // namespace
