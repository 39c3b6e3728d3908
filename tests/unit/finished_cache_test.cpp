#include "orchestrator/store/finished_cache.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace {

using namespace std::chrono_literals;
using idemsaga::orchestrator::store::FinishedAnswer;
using idemsaga::orchestrator::store::FinishedCache;
using idemsaga::orchestrator::store::ReplaySample;

FinishedAnswer Answer(std::string body) {
  return {std::string(64, 'a'), 201, std::move(body), std::string(32, 'b'), std::string(16, 'c')};
}

TEST(FinishedCache, ReturnsWhatWasPutForThatTenantAndKeyOnly) {
  FinishedCache cache({});
  cache.Put("demo", "A", Answer("{\"n\":1}"), 1h);
  auto hit = cache.Get("demo", "A");
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->body, "{\"n\":1}");
  EXPECT_EQ(hit->status, 201);
  EXPECT_FALSE(cache.Get("acme", "A"));  // another tenant's key
  EXPECT_FALSE(cache.Get("demo", "B"));
  // Tenant and key are kept apart: ("de", "moA") is not ("demo", "A").
  EXPECT_FALSE(cache.Get("de", "moA"));
}

TEST(FinishedCache, NeverOutlivesTheRowNorItsTtl) {
  FinishedCache cache({.ttl = 1h});
  cache.Put("demo", "expiring", Answer("x"), 30ms);
  cache.Put("demo", "gone", Answer("x"), 0ms);  // already expired: not kept
  EXPECT_TRUE(cache.Get("demo", "expiring"));
  EXPECT_FALSE(cache.Get("demo", "gone"));
  std::this_thread::sleep_for(60ms);
  EXPECT_FALSE(cache.Get("demo", "expiring"));

  FinishedCache short_ttl({.ttl = std::chrono::seconds(0)});
  short_ttl.Put("demo", "A", Answer("x"), 1h);
  EXPECT_FALSE(short_ttl.Get("demo", "A"));
}

TEST(FinishedCache, StaysWithinItsBytesDroppingTheLeastRecentlyUsed) {
  // Every entry below has the same size (keys of 4 digits): 8 of them fit in 4 KiB.
  FinishedCache cache({.max_bytes = 4096});
  auto put = [&](int i) {
    cache.Put("demo", std::to_string(i), Answer(std::string(200, 'x')), 1h);
  };
  for (int i = 1000; i < 1100; ++i) put(i);
  EXPECT_LE(cache.bytes(), 4096u);
  EXPECT_FALSE(cache.Get("demo", "1091"));
  // The 8 newest are kept; reading one makes it the newest: the next 4 evict the 4 oldest.
  ASSERT_TRUE(cache.Get("demo", "1095"));
  for (int i = 1100; i < 1104; ++i) put(i);
  EXPECT_TRUE(cache.Get("demo", "1095"));
  EXPECT_FALSE(cache.Get("demo", "1096"));
  EXPECT_TRUE(cache.Get("demo", "1097"));
  // An answer larger than a quarter of the cache is not kept at all.
  cache.Put("demo", "huge", Answer(std::string(2000, 'x')), 1h);
  EXPECT_FALSE(cache.Get("demo", "huge"));
}

TEST(FinishedCache, OffWhenItHasNoBytes) {
  FinishedCache cache({.max_bytes = 0});
  cache.Put("demo", "A", Answer("x"), 1h);
  EXPECT_FALSE(cache.Get("demo", "A"));
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(FinishedCache, TracesAKeysRetryStormOnceAWindowCountingTheRest) {
  FinishedCache cache({.trace_replays_every = 500ms});
  const std::string hash(64, 'a');
  cache.Put("demo", "A", Answer("x"), 1h);  // by a replay that was traced
  cache.Put("demo", "B", Answer("y"), 1h);
  ReplaySample s;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(cache.Replay("demo", "A", hash, s));
    EXPECT_FALSE(s.trace) << i;
  }
  // Each key is sampled apart: B's storm is not A's.
  ASSERT_TRUE(cache.Replay("demo", "B", hash, s));
  EXPECT_FALSE(s.trace);
  cache.Put("demo", "A", Answer("x"), 1h);  // a concurrent first replay's: the count goes on
  std::this_thread::sleep_for(550ms);
  ASSERT_TRUE(cache.Replay("demo", "A", hash, s));
  EXPECT_TRUE(s.trace);
  EXPECT_EQ(s.untraced_before, 50);
  ASSERT_TRUE(cache.Replay("demo", "A", hash, s));
  EXPECT_FALSE(s.trace);
  ASSERT_TRUE(cache.Replay("demo", "B", hash, s));
  EXPECT_TRUE(s.trace);
  EXPECT_EQ(s.untraced_before, 1);
}

TEST(FinishedCache, AReplayOfAnotherRequestIsNoHitAndSpendsNoSample) {
  FinishedCache cache({.trace_replays_every = 500ms});
  cache.Put("demo", "A", Answer("x"), 1h);
  std::this_thread::sleep_for(550ms);
  ReplaySample s;
  EXPECT_FALSE(cache.Replay("demo", "A", std::string(64, 'z'), s));  // another body: a reuse
  EXPECT_FALSE(cache.Replay("acme", "A", std::string(64, 'a'), s));  // another tenant
  ASSERT_TRUE(cache.Replay("demo", "A", std::string(64, 'a'), s));
  EXPECT_TRUE(s.trace);
  EXPECT_EQ(s.untraced_before, 0);
}

}  // namespace
