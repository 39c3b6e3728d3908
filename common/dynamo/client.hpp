// A small DynamoDB client: the JSON API over HTTP/1.1 (`X-Amz-Target: DynamoDB_20120810.<op>`,
// application/x-amz-json-1.0), each request signed with AWS Signature Version 4, for the guard's
// key store on DynamoDB (steps/guard/dynamo_guard.hpp). Written here because Debian 12 packages
// no AWS SDK for C++; it does what that store needs and nothing else (no retries of its own, no
// pagination helpers, no credential chain beyond the usual environment variables).
//
// Every call ends within its timeouts. Its outcomes: the answer's JSON; a failed
// ConditionExpression (a value, not an exception: the store reads it); an outage
// (throttling, a 5xx, no answer: Unavailable, a 503 whose retry with the same key is safe,
// since every call is atomic and nothing is half written); or a request DynamoDB refused
// (Error, naming its type: a bug or a missing table, not an outage).
//
// Plain http:// only: cpp-httplib is built here without TLS, so AWS itself is reached through
// a local TLS-terminating proxy (docs/dynamodb.md). Thread-safe: kept-alive connections, one
// per concurrent call.
//   Client dynamo(Client::FromEnvironment("http://127.0.0.1:8000"));
//   auto r = dynamo.Call("GetItem", {{"TableName", "idempotency_keys"}, {"Key", key}});
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/unavailable.hpp"

namespace idemsaga::common::dynamo {

// DynamoDB could not be reached, answered 5xx, or throttled the call: nothing is known to have
// happened beyond what a retry with the same key settles.
class Unavailable : public common::Unavailable {
  using common::Unavailable::Unavailable;
};

// A request DynamoDB refused (a 4xx other than throttling and a failed condition).
class Error : public std::runtime_error {
 public:
  Error(std::string type, const std::string& message)
      : std::runtime_error(type + ": " + message), type_(std::move(type)) {}
  // The exception's name without its namespace: "ResourceNotFoundException".
  const std::string& type() const { return type_; }

 private:
  std::string type_;
};

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only
};

// A request as SigV4 canonicalises it.
struct SignedRequest {
  std::string method = "POST";
  std::string path = "/";
  std::string query;  // already canonical (sorted, URI-encoded); empty for DynamoDB
  std::map<std::string, std::string> headers;  // lower-case names: every one is signed
  std::string body;
};

// The Authorization header's value for `req` at `amz_date` (YYYYMMDDTHHMMSSZ, the request's
// x-amz-date).
std::string SignV4(const SignedRequest& req, const Credentials& credentials,
                   const std::string& region, const std::string& service,
                   const std::string& amz_date);

class Client {
 public:
  struct Options {
    // http://host[:port] of the endpoint.
    std::string url = "http://127.0.0.1:8000";
    std::string region = "us-east-1";
    Credentials credentials;
    std::chrono::milliseconds connect_timeout{1000};
    // A conditional write on one item takes milliseconds; this bounds a stalled endpoint.
    std::chrono::milliseconds request_timeout{3000};
  };
  // `url`, with the region and credentials from AWS_REGION (or AWS_DEFAULT_REGION),
  // AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; an emulator's placeholder
  // credentials when none are set.
  static Options FromEnvironment(const std::string& url);

  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  struct Result {
    bool condition_failed = false;  // ConditionalCheckFailedException: nothing was written
    nlohmann::json body;            // the answer (an object; empty when condition_failed)
  };
  // Calls `operation` ("PutItem") with `request`. Throws Unavailable or Error.
  Result Call(const std::string& operation, const nlohmann::json& request);

 private:
  struct Connection;  // a kept-alive cpp-httplib client, out of this header
  std::unique_ptr<Connection> Borrow();
  void Return(std::unique_ptr<Connection> connection);

  Options options_;
  std::string host_;  // the Host header, as signed
  std::mutex mutex_;
  std::vector<std::unique_ptr<Connection>> idle_;
};

}  // namespace idemsaga::common::dynamo
