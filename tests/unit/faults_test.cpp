#include "demo/faults.hpp"

#include <gtest/gtest.h>

namespace {

using idemsaga::demo::ParseFaultSettings;

TEST(FaultSettings, ParsesEveryField) {
  std::string error;
  auto s = ParseFaultSettings({{"error_rate", 0.5},
                               {"drop_after_commit_rate", 1},
                               {"latency_ms", 250},
                               {"hang", true},
                               {"retry_after_s", 30},
                               {"key_prefix", "outage-"}},
                              error);
  ASSERT_TRUE(s) << error;
  EXPECT_EQ(s->retry_after_s, 30);
  EXPECT_EQ(s->key_prefix, "outage-");
  EXPECT_DOUBLE_EQ(s->error_rate, 0.5);
  EXPECT_DOUBLE_EQ(s->drop_after_commit_rate, 1.0);
  EXPECT_EQ(s->latency_ms, 250);
  EXPECT_TRUE(s->hang);
}

TEST(FaultSettings, AnEmptyObjectTurnsEverythingOff) {
  std::string error;
  auto s = ParseFaultSettings(nlohmann::json::object(), error);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->error_rate, 0);
  EXPECT_FALSE(s->hang);
}

TEST(FaultSettings, RejectsOutOfRangeWrongTypeAndUnknownFields) {
  for (const auto& bad :
       {nlohmann::json{{"error_rate", 1.5}}, nlohmann::json{{"error_rate", -0.1}},
        nlohmann::json{{"latency_ms", -1}}, nlohmann::json{{"latency_ms", 0.5}},
        nlohmann::json{{"hang", "yes"}}, nlohmann::json{{"retry_after_s", 3601}},
        nlohmann::json{{"key_prefix", 1}}, nlohmann::json{{"typo", 1}}, nlohmann::json::array()}) {
    std::string error;
    EXPECT_FALSE(ParseFaultSettings(bad, error)) << bad.dump();
    EXPECT_FALSE(error.empty());
  }
}

TEST(Faults, FailNextFailsExactlyThatManyRequests) {
  idemsaga::demo::Faults faults({.fail_next = 2});
  EXPECT_TRUE(faults.Fail("k-1"));
  EXPECT_TRUE(faults.Fail("k-2"));
  EXPECT_FALSE(faults.Fail("k-3"));
  EXPECT_EQ(faults.Get().fail_next, 0);
}

TEST(Faults, RateOneAlwaysFiresAndRateZeroNever) {
  idemsaga::demo::Faults faults({.error_rate = 1, .drop_after_commit_rate = 0});
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(faults.Fail("k"));
    EXPECT_FALSE(faults.ShouldDropAfterCommit());
  }
}

TEST(Faults, AKeyPrefixFailsOnlyTheKeysThatStartWithItWithItsRetryAfter) {
  idemsaga::demo::Faults faults({.error_rate = 1, .retry_after_s = 30, .key_prefix = "outage-"});
  EXPECT_EQ(faults.Fail("outage-17-payment"), 30);
  EXPECT_FALSE(faults.Fail("healthy-17-payment"));
  EXPECT_FALSE(faults.Fail("outage"));
}

TEST(Faults, FailNextCountsOnlyTheSelectedKeys) {
  idemsaga::demo::Faults faults({.fail_next = 1, .key_prefix = "a-"});
  EXPECT_FALSE(faults.Fail("b-1"));
  EXPECT_EQ(faults.Fail("a-1"), 1);
  EXPECT_FALSE(faults.Fail("a-2"));
}

}  // namespace
