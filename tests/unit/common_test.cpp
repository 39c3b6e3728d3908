#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/pg/url.hpp"
#include "common/request_input.hpp"

namespace {

using idemsaga::common::ParseIdempotencyKey;

TEST(IdempotencyKey, MissingHeaderIsReportedAsMissing) {
  auto k = ParseIdempotencyKey(0, "", 255);
  EXPECT_EQ(k.error, "idempotency_key_missing");
}

TEST(IdempotencyKey, BareTokenIsTheKey) {
  auto k = ParseIdempotencyKey(1, "order-8f3a", 255);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k.key, "order-8f3a");
}

TEST(IdempotencyKey, QuotedSfStringMeansTheSameKeyAsTheBareToken) {
  auto quoted = ParseIdempotencyKey(1, "\"order-8f3a\"", 255);
  ASSERT_TRUE(quoted.ok());
  EXPECT_EQ(quoted.key, ParseIdempotencyKey(1, "order-8f3a", 255).key);
}

TEST(IdempotencyKey, QuotedFormDecodesEscapes) {
  auto k = ParseIdempotencyKey(1, R"("a\"b\\c")", 255);
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
                                         {R"("bad\escape")", 255},
                                         // Not one sf-string Item: lists and parameters.
                                         {"a, b", 255},
                                         {"a,b", 255},
                                         {R"("a", "b")", 255},
                                         {R"("a";p=1)", 255},
                                         {R"("a" )", 255},
                                         {R"(a"b)", 255},
                                         {"a;p=1", 255},
                                         {" lead", 255},
                                         {"trail ", 255},
                                         {std::string("nul\0x", 5), 255}}) {
    auto k = ParseIdempotencyKey(1, c.value, c.max);
    EXPECT_EQ(k.error, "idempotency_key_invalid") << "value: " << c.value;
    EXPECT_FALSE(k.message.empty());
  }
}

TEST(IdempotencyKey, TheHeaderSentTwiceIsRefusedNotMerged) {
  auto k = ParseIdempotencyKey(2, "a", 255);
  EXPECT_EQ(k.error, "idempotency_key_invalid");
}

TEST(IdempotencyKey, QuotedFormKeepsSpacesCommasAndPercentSignsAsTheyAre) {
  for (const char* raw : {R"(" lead-X")", R"("trail ")", R"("a, b")", R"("pct%41-X")",
                          R"("plus+key")", R"("dk%2541-X")"}) {
    auto k = ParseIdempotencyKey(1, raw, 255);
    ASSERT_TRUE(k.ok()) << raw << ": " << k.message;
    EXPECT_EQ(k.key, std::string(raw + 1, std::strlen(raw) - 2)) << raw;
  }
  EXPECT_EQ(ParseIdempotencyKey(1, "pct%41-X", 255).key, "pct%41-X");  // never decoded
}

// The property every hop relies on: what one service formats, the next parses back to the
// same bytes, and two different keys never format alike.
TEST(IdempotencyKey, FormatThenParseIsTheIdentityOverTheWholeAlphabet) {
  std::mt19937 rng(8941);
  std::string alphabet;
  for (char c = 0x20; c <= 0x7e; ++c) alphabet.push_back(c);
  std::set<std::string> formatted;
  std::set<std::string> keys;
  constexpr int kCases = 20000;
  for (int i = 0; i < kCases; ++i) {
    size_t len = 1 + rng() % (i % 10 == 0 ? 255 : 12);  // short keys collide more: good
    std::string key;
    for (size_t j = 0; j < len; ++j) {
      // Bias towards the characters that break naive code.
      static const std::string kNasty = "\\\"% ,+;=";
      key.push_back(rng() % 3 == 0 ? kNasty[rng() % kNasty.size()]
                                   : alphabet[rng() % alphabet.size()]);
    }
    auto wire = idemsaga::common::FormatIdempotencyKey(key);
    auto back = ParseIdempotencyKey(1, wire, 255);
    ASSERT_TRUE(back.ok()) << "key [" << key << "] as " << wire << ": " << back.message;
    ASSERT_EQ(back.key, key) << wire;
    keys.insert(key);
    formatted.insert(wire);
  }
  EXPECT_EQ(formatted.size(), keys.size());
}

TEST(IdempotencyKey, KeyBytesAreValidatedWithoutHeaderSyntax) {
  EXPECT_TRUE(idemsaga::common::IsValidKeyBytes(R"(x"y-inventory)", 255));
  EXPECT_TRUE(idemsaga::common::IsValidKeyBytes(" lead", 255));
  EXPECT_FALSE(idemsaga::common::IsValidKeyBytes("", 255));
  EXPECT_FALSE(idemsaga::common::IsValidKeyBytes(std::string("a\0b", 3), 255));
  EXPECT_FALSE(idemsaga::common::IsValidKeyBytes(std::string(256, 'k'), 255));
}

TEST(IdempotencyKey, AcceptsExactlyTheMaximumLength) {
  EXPECT_TRUE(ParseIdempotencyKey(1, std::string(200, 'k'), 200).ok());
}

TEST(TenantId, AllowsOnlyShortSafeNames) {
  EXPECT_TRUE(idemsaga::common::IsValidTenantId("demo"));
  EXPECT_TRUE(idemsaga::common::IsValidTenantId("acme_EU-1"));
  EXPECT_FALSE(idemsaga::common::IsValidTenantId(""));
  EXPECT_FALSE(idemsaga::common::IsValidTenantId("a b"));
  EXPECT_FALSE(idemsaga::common::IsValidTenantId("x/../y"));
  EXPECT_FALSE(idemsaga::common::IsValidTenantId(std::string(65, 'a')));
}

TEST(PgUrl, ReplacesTheDatabaseAndKeepsParameters) {
  EXPECT_EQ(idemsaga::common::pg::WithDatabase("postgresql://u@h:5/old?sslmode=disable", "new"),
            "postgresql://u@h:5/new?sslmode=disable");
  EXPECT_EQ(idemsaga::common::pg::WithDatabase("postgresql://u@h:5", "new"),
            "postgresql://u@h:5/new");
  EXPECT_EQ(idemsaga::common::pg::DatabaseOf("postgresql://u@h:5/db?x=1"), "db");
}

TEST(PgUrl, PercentEncodesAddedParameters) {
  EXPECT_EQ(idemsaga::common::pg::WithParam("postgresql://h/db", "options", "-c a=1"),
            "postgresql://h/db?options=-c%20a%3D1");
  EXPECT_EQ(idemsaga::common::pg::WithParam("postgresql://h/db?x=1", "y", "2"),
            "postgresql://h/db?x=1&y=2");
}

TEST(PgUrl, RejectsSomethingThatIsNotAUrl) {
  EXPECT_THROW(idemsaga::common::pg::WithDatabase("host=localhost", "x"), std::invalid_argument);
}

TEST(Crypto, Sha256MatchesAKnownVector) {
  EXPECT_EQ(idemsaga::common::Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Crypto, ConstantTimeEqualsComparesContent) {
  EXPECT_TRUE(idemsaga::common::ConstantTimeEquals("dev-service-token", "dev-service-token"));
  EXPECT_FALSE(idemsaga::common::ConstantTimeEquals("dev-service-token", "dev-service-tokeN"));
  EXPECT_FALSE(idemsaga::common::ConstantTimeEquals("", "x"));
}

TEST(Crypto, RandomHexHasTheAskedLengthAndVaries) {
  auto a = idemsaga::common::RandomHex(16), b = idemsaga::common::RandomHex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_NE(a, b);
}

TEST(Log, JsonFormatWritesOneObjectPerLineWhateverTheValuesHold) {
  idemsaga::common::SetLogFormat(idemsaga::common::LogFormat::kJson);
  testing::internal::CaptureStderr();
  idemsaga::common::Log("step_call",
                        {{"key", "a \"quoted\" key\nwith a newline"}, {"bytes", "\xff\xfe"}});
  std::string out = testing::internal::GetCapturedStderr();
  idemsaga::common::SetLogFormat(idemsaga::common::LogFormat::kText);
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["event"], "step_call");
  EXPECT_EQ(j["key"], "a \"quoted\" key\nwith a newline");
  EXPECT_EQ(j["bytes"], "\xef\xbf\xbd\xef\xbf\xbd");  // invalid UTF-8 replaced, line still valid
  EXPECT_EQ(j["ts"].get<std::string>().size(), 24u);
}

// What every wire (the HTTP routes, the AMQP intake) reads a request's body and caller with.
TEST(RequestInput, ReadsAJsonBodyOrSaysWhyNot) {
  const idemsaga::common::JsonLimits limits{.max_bytes = 32, .max_depth = 2};
  struct Case {
    std::string_view type, body;
    int status;  // 0: accepted
    std::string code;
  } cases[] = {
      {"application/json", R"({"a":1})", 0, ""},
      {"Application/JSON ; charset=utf-8", R"({"a":[1]})", 0, ""},
      {"text/plain", R"({"a":1})", 415, "unsupported_media_type"},
      {"", "{}", 415, "unsupported_media_type"},
      {"application/json", R"({"a":"0123456789012345678901234567890"})", 413, "payload_too_large"},
      {"application/json", R"({"a":[[1]]})", 400, "invalid_json"},
      {"application/json", R"({"a":"\u0000"})", 400, "invalid_json"},
      {"application/json", "{", 400, "invalid_json"},
  };
  for (const auto& c : cases) {
    auto body = idemsaga::common::ReadJsonBody(c.type, c.body, limits);
    EXPECT_EQ(body.value.has_value(), c.status == 0) << c.type << " " << c.body;
    if (c.status == 0) continue;
    EXPECT_EQ(body.refusal.status, c.status) << c.body;
    EXPECT_EQ(body.refusal.code, c.code) << c.body;
  }
  // The OTLP intake checks each span's strings itself.
  EXPECT_TRUE(idemsaga::common::ReadJsonBody("application/json", R"({"a":"\u0000"})", limits,
                                             idemsaga::common::NulInJson::kCallerChecksFields)
                  .value);
}

TEST(RequestInput, TakesTheTokenOfABearerAuthorizationOnly) {
  EXPECT_EQ(idemsaga::common::BearerTokenOf("Bearer abc"), "abc");
  EXPECT_EQ(idemsaga::common::BearerTokenOf("bEaReR   abc"), "abc");
  EXPECT_EQ(idemsaga::common::BearerTokenOf("Basic abc"), "");
  EXPECT_EQ(idemsaga::common::BearerTokenOf("Bearerabc"), "");
  EXPECT_EQ(idemsaga::common::BearerTokenOf("Bearer "), "");
  EXPECT_EQ(idemsaga::common::BearerTokenOf("Bearer    "), "");
  EXPECT_EQ(idemsaga::common::BearerTokenOf(""), "");
}

}  // namespace
