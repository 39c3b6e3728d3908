// Spans riding on sagas' finishes (orchestrator/store/span_rides.hpp), against the run's
// PostgreSQL: a carried span row is written by a finish's own transaction (the same xmin as a
// key row), so spans cost no commit of their own; with no finish they are written alone; a
// finish its passengers break still finishes, and their owner writes them.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "common/crypto.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "orchestrator/store/span_rides.hpp"
#include "orchestrator/store/span_store.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::common::trace::SpanData;
using idemsaga::orchestrator::store::Claim;
using idemsaga::orchestrator::store::ClaimRequest;
using idemsaga::orchestrator::store::ParentStore;
using idemsaga::orchestrator::store::SpanRides;
using idemsaga::orchestrator::store::SpanStore;
using test_support::ScratchDatabase;

// Nothing waits out a deadline here: a part is written alone only because no finish ran, or
// because the finish that took it failed.
constexpr SpanRides::Options kPatient{.wait = std::chrono::minutes(1),
                                      .idle = std::chrono::minutes(1)};

std::string Trace(int i) {
  return idemsaga::common::Sha256Hex("trace" + std::to_string(i)).substr(0, 32);
}

SpanData Span(int trace, int n) {
  SpanData s;
  s.trace_id = Trace(trace);
  s.span_id =
      idemsaga::common::Sha256Hex(std::to_string(trace) + "/" + std::to_string(n)).substr(0, 16);
  s.service = "inventory";
  s.name = "span " + std::to_string(n);
  s.start_unix_nano = 1;
  s.end_unix_nano = 2;
  s.attributes["tenant"] = std::string("demo");  // spans are read through a tenant
  return s;
}

class SpanRidesTest : public ::testing::Test {
 protected:
  SpanRidesTest()
      : db_("orchestrator"),
        pool_({.url = db_.url(), .size = 4}),
        rides_(kPatient),
        store_(pool_, {}, &rides_),
        spans_(pool_, &rides_) {
    store_.UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
  }

  // Claims a new key and finishes it; its status after.
  std::string ClaimAndFinish(int i) {
    std::string key = "k" + std::to_string(i);
    ClaimRequest req{"demo",
                     key,
                     idemsaga::common::Sha256Hex(key),
                     {{"n", i}},
                     "place_order",
                     1,
                     "owner-a",
                     Trace(100000 + i)};
    Claim c = store_.ClaimKey(req);
    EXPECT_EQ(c.kind, Claim::kClaimed);
    EXPECT_TRUE(store_.Finish(c.lease, true, 201, "{}", nlohmann::json::array()));
    return db_.Text("SELECT status::text FROM idempotency_keys WHERE idempotency_key = $1", key);
  }

  ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
  SpanRides rides_;
  ParentStore store_;
  SpanStore spans_;
};

TEST_F(SpanRidesTest, UnderLoadEverySpanRowIsWrittenByAFinishAndCostsNoCommitOfItsOwn) {
  ClaimAndFinish(0);  // a finish has run: there is load to ride on
  constexpr int kWriters = 2, kBatches = 15, kTraces = 4, kSpans = 3;
  std::atomic<int> writing{kWriters};
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (int b = 0; b < kBatches; ++b) {
        std::vector<SpanData> batch;
        for (int t = 0; t < kTraces; ++t) {
          for (int n = 0; n < kSpans; ++n)
            batch.push_back(Span((w * kBatches + b) * kTraces + t, n));
        }
        spans_.Insert(batch);  // returns once stored
      }
      --writing;
    });
  }
  int finishes = 1;
  while (writing > 0) EXPECT_EQ(ClaimAndFinish(finishes++), "completed");
  for (auto& t : writers) t.join();

  constexpr int kRows = kWriters * kBatches * kTraces;
  EXPECT_EQ(rides_.carried(), kRows);
  EXPECT_EQ(rides_.alone(), 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM trace_spans"), kRows);
  // Each row was inserted by the transaction that finished a key.
  EXPECT_EQ(db_.Count("SELECT count(*) FROM trace_spans s WHERE NOT EXISTS "
                      "(SELECT 1 FROM idempotency_keys k WHERE k.xmin = s.xmin "
                      "AND k.status = 'completed')"),
            0);
  for (int i = 0; i < kRows; ++i) {
    auto got = spans_.ForTrace("demo", Trace(i));
    ASSERT_EQ(got.size(), static_cast<size_t>(kSpans)) << i;
    EXPECT_EQ(got[0].service, "inventory");
  }
  std::cout << "span_rides: " << kRows << " span rows in " << finishes
            << " finishes, 0 commits of their own" << std::endl;
}

TEST_F(SpanRidesTest, WithNoFinishRunningSpansAreWrittenAloneAtOnce) {
  SpanRides rides({.wait = std::chrono::minutes(1), .idle = std::chrono::milliseconds(50)});
  SpanStore spans(pool_, &rides);
  spans.Insert({Span(1, 0), Span(1, 1), Span(2, 0)});  // would hang a minute if it waited
  EXPECT_EQ(rides.alone(), 2);
  EXPECT_EQ(rides.carried(), 0);
  EXPECT_EQ(spans.ForTrace("demo", Trace(1)).size(), 2u);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM trace_spans s WHERE EXISTS "
                      "(SELECT 1 FROM idempotency_keys k WHERE k.xmin = s.xmin)"),
            0);
}

TEST_F(SpanRidesTest, ARowLargerThanAFinishCarriesIsWrittenAloneEvenUnderLoad) {
  ClaimAndFinish(0);  // load to ride on, and no finish after: a ride would wait a minute
  std::vector<SpanData> batch;
  batch.reserve(200);
  for (int n = 0; n < 200; ++n) batch.push_back(Span(7, n));  // one trace, ~40 KiB
  spans_.Insert(batch);
  EXPECT_EQ(rides_.alone(), 1);
  EXPECT_EQ(rides_.carried(), 0);
  EXPECT_EQ(spans_.ForTrace("demo", Trace(7)).size(), 200u);
}

TEST_F(SpanRidesTest, AFinishItsPassengersBreakStillFinishesAndTheirOwnerWritesThem) {
  ClaimAndFinish(0);
  // A row the table refuses (its trace id is not 32 hex digits): the finish carrying it fails.
  std::atomic<bool> returned{false};
  std::string alone;
  std::thread owner([&] {
    rides_.Carry({R"("not-a-trace-id":[{"span_id":"x"}])"}, [&](const std::string& doc) {
      alone = doc;
      returned = true;
    });
  });
  int i = 1;
  for (; !returned && i < 2000; ++i) {
    EXPECT_EQ(ClaimAndFinish(i), "completed") << i;
  }
  owner.join();
  EXPECT_TRUE(returned);
  EXPECT_EQ(alone, R"({"not-a-trace-id":[{"span_id":"x"}]})");
  EXPECT_EQ(rides_.carried(), 0);
  EXPECT_EQ(rides_.alone(), 1);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM trace_spans"), 0);
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE status = 'completed'"), i);
}

}  // namespace
