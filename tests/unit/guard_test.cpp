#include "steps/guard/guard.hpp"

#include <gtest/gtest.h>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"

namespace {

using idemsaga::steps::guard::Fingerprint;
using idemsaga::steps::guard::Request;
using idemsaga::steps::protocol::KeyRecord;
using idemsaga::steps::protocol::KeyStatus;
using idemsaga::steps::protocol::Outcome;
using idemsaga::steps::protocol::Refusal;

Request Make(std::string path, nlohmann::json body) {
  return Request{"demo", "k", "POST", std::move(path), std::move(body)};
}

TEST(Fingerprint, IgnoresKeyOrderAndWhitespaceOfTheBody) {
  auto a = Make("/v1/charges", nlohmann::json::parse(R"({"a":1,"b":[1,2]})"));
  auto b = Make("/v1/charges", nlohmann::json::parse(R"({ "b" : [1, 2], "a" : 1 })"));
  EXPECT_EQ(Fingerprint(a), Fingerprint(b));
}

TEST(Fingerprint, DiffersWhenBodyPathOrMethodDiffers) {
  auto base = Make("/v1/charges", {{"a", 1}});
  auto other_body = Make("/v1/charges", {{"a", 2}});
  auto other_path = Make("/v1/refunds", {{"a", 1}});
  auto other_method = base;
  other_method.method = "PUT";
  EXPECT_NE(Fingerprint(base), Fingerprint(other_body));
  EXPECT_NE(Fingerprint(base), Fingerprint(other_path));
  EXPECT_NE(Fingerprint(base), Fingerprint(other_method));
}

TEST(Fingerprint, DoesNotDependOnTenantOrKey) {
  auto a = Make("/p", {{"x", 1}});
  auto b = a;
  b.tenant_id = "acme";
  b.key = "other";
  EXPECT_EQ(Fingerprint(a), Fingerprint(b));
}

// One function at both layers: a participant's guard and the orchestrator's parent key bind
// a key to the same thing, and a fingerprint stored by either means what it says.
TEST(Fingerprint, IsTheSharedRequestFingerprintPinnedToItsBytes) {
  auto req = Make("/v1/charges", {{"amount_cents", 5}});
  EXPECT_EQ(Fingerprint(req),
            idemsaga::common::RequestFingerprint("POST", "/v1/charges", req.body));
  EXPECT_EQ(Fingerprint(req),
            idemsaga::common::Sha256Hex("POST\n/v1/charges\n{\"amount_cents\":5}"));
}

// The participant protocol's names (steps/protocol/participant_protocol.hpp) are the wire's
// and the metrics': each table parses back what it prints, and the names stay these.
TEST(Protocol, OutcomeNamesRoundTripAndStayTheWireNames) {
  for (const auto& [outcome, name] : idemsaga::steps::protocol::kOutcomeNames) {
    EXPECT_EQ(idemsaga::steps::protocol::ParseOutcome(name), outcome) << name;
  }
  EXPECT_STREQ(ToString(Outcome::kInProgress), "in_progress");
  EXPECT_STREQ(ToString(Outcome::kNothingToUndo), "nothing_to_undo");
  EXPECT_STREQ(idemsaga::steps::protocol::MetricLabel(Outcome::kCancelled), "tombstoned");
  EXPECT_STREQ(idemsaga::steps::protocol::MetricLabel(Outcome::kReused), "reused");
  EXPECT_EQ(idemsaga::steps::protocol::ParseOutcome("tombstoned"), std::nullopt);
}

TEST(Protocol, KeyRecordJsonRoundTrips) {
  for (const auto& [status, name] : idemsaga::steps::protocol::kKeyStatusNames) {
    EXPECT_EQ(idemsaga::steps::protocol::ParseKeyStatus(name), status) << name;
  }
  KeyRecord k{"A-payment", KeyStatus::kTombstone, 409, false, 1.5};
  auto json = k.ToJson();
  EXPECT_EQ(json.dump(),
            R"({"age_seconds":1.5,"compensated":false,"key":"A-payment","response_status":409,)"
            R"("status":"tombstone"})");
  auto back = KeyRecord::FromJson(json);
  EXPECT_EQ(back.key, k.key);
  EXPECT_EQ(back.status, k.status);
  EXPECT_EQ(back.response_status, 409);
  EXPECT_FALSE(back.Applied());
  json["status"] = "lost";
  EXPECT_THROW(KeyRecord::FromJson(json), std::invalid_argument);
}

TEST(Protocol, RefusalsCarryTheirCodeOutcomeAndTheOneRetryAfterRule) {
  for (const auto& entry : idemsaga::steps::protocol::kRefusals) {
    auto res = idemsaga::steps::guard::Refuse(entry.refusal);
    auto body = nlohmann::json::parse(res.body);
    EXPECT_EQ(res.status, idemsaga::steps::protocol::HttpStatus(entry.code));
    EXPECT_EQ(body["code"], ToString(entry.code));
    EXPECT_EQ(body["detail"], entry.detail);
    EXPECT_EQ(res.outcome, entry.outcome);
    EXPECT_EQ(res.headers.count("Retry-After"),
              entry.code == idemsaga::steps::protocol::GuardCode::kInProgress ? 1U : 0U);
  }
  EXPECT_EQ(idemsaga::steps::guard::Refuse(Refusal::kKeyReused).status, 422);
  EXPECT_EQ(idemsaga::steps::guard::Refuse(Refusal::kClaimTakenOver).outcome, Outcome::kFenced);
}

}  // namespace
