#include <gtest/gtest.h>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/url.hpp"

namespace {

using common::ParseIdempotencyKey;

TEST(IdempotencyKey, MissingHeaderIsReportedAsMissing) {
  auto k = ParseIdempotencyKey(false, "", 255);
  EXPECT_EQ(k.error, "idempotency_key_missing");
}

TEST(IdempotencyKey, BareTokenIsTheKey) {
  auto k = ParseIdempotencyKey(true, "order-8f3a", 255);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k.key, "order-8f3a");
}

TEST(IdempotencyKey, QuotedSfStringMeansTheSameKeyAsTheBareToken) {
  auto quoted = ParseIdempotencyKey(true, "\"order-8f3a\"", 255);
  ASSERT_TRUE(quoted.ok());
  EXPECT_EQ(quoted.key, ParseIdempotencyKey(true, "order-8f3a", 255).key);
}

TEST(IdempotencyKey, QuotedFormDecodesEscapes) {
  auto k = ParseIdempotencyKey(true, R"("a\"b\\c")", 255);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k.key, R"(a"b\c)");
}

TEST(IdempotencyKey, RejectsEmptyTooLongNonPrintableAndBadQuoting) {
  struct Case {
    std::string value;
    size_t max;
  };
  for (const auto& c : std::vector<Case>{{"", 255},
                                         {"\"\"", 255},
                                         {std::string(256, 'k'), 255},
                                         {std::string(201, 'k'), 200},
                                         {"tab\there", 255},
                                         {"caf\xc3\xa9", 255},
                                         {"\"open", 255},
                                         {"\"a\"b\"", 255},
                                         {R"("bad\escape")", 255}}) {
    auto k = ParseIdempotencyKey(true, c.value, c.max);
    EXPECT_EQ(k.error, "idempotency_key_invalid") << "value: " << c.value;
    EXPECT_FALSE(k.message.empty());
  }
}

TEST(IdempotencyKey, AcceptsExactlyTheMaximumLength) {
  EXPECT_TRUE(ParseIdempotencyKey(true, std::string(200, 'k'), 200).ok());
}

TEST(TenantId, AllowsOnlyShortSafeNames) {
  EXPECT_TRUE(common::IsValidTenantId("demo"));
  EXPECT_TRUE(common::IsValidTenantId("acme_EU-1"));
  EXPECT_FALSE(common::IsValidTenantId(""));
  EXPECT_FALSE(common::IsValidTenantId("a b"));
  EXPECT_FALSE(common::IsValidTenantId("x/../y"));
  EXPECT_FALSE(common::IsValidTenantId(std::string(65, 'a')));
}

TEST(PgUrl, ReplacesTheDatabaseAndKeepsParameters) {
  EXPECT_EQ(common::pg::WithDatabase("postgresql://u@h:5/old?sslmode=disable", "new"),
            "postgresql://u@h:5/new?sslmode=disable");
  EXPECT_EQ(common::pg::WithDatabase("postgresql://u@h:5", "new"), "postgresql://u@h:5/new");
  EXPECT_EQ(common::pg::DatabaseOf("postgresql://u@h:5/db?x=1"), "db");
}

TEST(PgUrl, PercentEncodesAddedParameters) {
  EXPECT_EQ(common::pg::WithParam("postgresql://h/db", "options", "-c a=1"),
            "postgresql://h/db?options=-c%20a%3D1");
  EXPECT_EQ(common::pg::WithParam("postgresql://h/db?x=1", "y", "2"), "postgresql://h/db?x=1&y=2");
}

TEST(PgUrl, RejectsSomethingThatIsNotAUrl) {
  EXPECT_THROW(common::pg::WithDatabase("host=localhost", "x"), std::invalid_argument);
}

TEST(Crypto, Sha256MatchesAKnownVector) {
  EXPECT_EQ(common::Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Crypto, ConstantTimeEqualsComparesContent) {
  EXPECT_TRUE(common::ConstantTimeEquals("dev-service-token", "dev-service-token"));
  EXPECT_FALSE(common::ConstantTimeEquals("dev-service-token", "dev-service-tokeN"));
  EXPECT_FALSE(common::ConstantTimeEquals("", "x"));
}

TEST(Crypto, RandomHexHasTheAskedLengthAndVaries) {
  auto a = common::RandomHex(16), b = common::RandomHex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

}  // namespace
