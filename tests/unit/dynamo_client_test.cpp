// common/dynamo: SigV4 against AWS's published Signature Version 4 test suite (its example
// credentials, date, region and service), and what the client makes of an endpoint that is
// not there. The client against a real DynamoDB API (dynalite) is participant_stores_itest's.
#include <gtest/gtest.h>

#include "common/crypto.hpp"
#include "common/dynamo/client.hpp"
#include "common/net.hpp"

namespace {

using idemsaga::common::dynamo::Client;
using idemsaga::common::dynamo::Credentials;
using idemsaga::common::dynamo::SignedRequest;
using idemsaga::common::dynamo::SignV4;

const Credentials kExample{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};

SignedRequest Vanilla(const std::string& method) {
  SignedRequest req;
  req.method = method;
  req.headers = {{"host", "example.amazonaws.com"}, {"x-amz-date", "20150830T123600Z"}};
  return req;
}

// aws-sig-v4-test-suite/get-vanilla: GET / with only Host and X-Amz-Date.
TEST(SigV4, SignsAwsGetVanillaExample) {
  EXPECT_EQ(SignV4(Vanilla("GET"), kExample, "us-east-1", "service", "20150830T123600Z"),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

// aws-sig-v4-test-suite/post-vanilla: the same as a POST, which is how DynamoDB is called.
TEST(SigV4, SignsAwsPostVanillaExample) {
  EXPECT_EQ(SignV4(Vanilla("POST"), kExample, "us-east-1", "service", "20150830T123600Z"),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

// The body, every signed header's value and the credentials each change the signature.
TEST(SigV4, SignsTheBodyAndEveryHeader) {
  auto base = Vanilla("POST");
  base.body = R"({"TableName":"keys"})";
  const auto sig = SignV4(base, kExample, "us-east-1", "dynamodb", "20150830T123600Z");
  auto other_body = base;
  other_body.body = R"({"TableName":"keyz"})";
  auto other_target = base;
  other_target.headers["x-amz-target"] = "DynamoDB_20120810.PutItem";
  Credentials other_secret = kExample;
  other_secret.secret_access_key += "x";
  EXPECT_NE(SignV4(other_body, kExample, "us-east-1", "dynamodb", "20150830T123600Z"), sig);
  EXPECT_NE(SignV4(other_target, kExample, "us-east-1", "dynamodb", "20150830T123600Z"), sig);
  EXPECT_NE(SignV4(base, other_secret, "us-east-1", "dynamodb", "20150830T123600Z"), sig);
  EXPECT_NE(SignV4(base, kExample, "eu-west-1", "dynamodb", "20150830T123600Z"), sig);
  EXPECT_NE(SignV4(other_target, kExample, "us-east-1", "dynamodb", "20150830T123600Z")
                .find("SignedHeaders=host;x-amz-date;x-amz-target,"),
            std::string::npos);
}

// RFC 4231 test case 2: HMAC-SHA256 under the key "Jefe".
TEST(SigV4, HmacSha256MatchesRfc4231) {
  EXPECT_EQ(
      idemsaga::common::Hex(idemsaga::common::HmacSha256("Jefe", "what do ya want for nothing?")),
      "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

// Nothing listening: an outage (503 at the edge), never a hang or another error.
TEST(DynamoClient, AnEndpointNotThereIsUnavailable) {
  Client client({.url = "http://127.0.0.1:" + std::to_string(idemsaga::common::FreeLoopbackPort()),
                 .credentials = kExample,
                 .connect_timeout = std::chrono::milliseconds(300),
                 .request_timeout = std::chrono::milliseconds(300)});
  EXPECT_THROW(client.Call("ListTables", nlohmann::json::object()),
               idemsaga::common::dynamo::Unavailable);
}

TEST(DynamoClient, RefusesAnEndpointItCannotReach) {
  EXPECT_THROW(Client({.url = "https://dynamodb.us-east-1.amazonaws.com"}), std::invalid_argument);
}

}  // namespace
