#include "steps/guard/guard.hpp"

#include <gtest/gtest.h>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"

namespace {

using steps::guard::Fingerprint;
using steps::guard::Request;

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
  EXPECT_EQ(Fingerprint(req), common::RequestFingerprint("POST", "/v1/charges", req.body));
  EXPECT_EQ(Fingerprint(req), common::Sha256Hex("POST\n/v1/charges\n{\"amount_cents\":5}"));
}

}  // namespace
