// Test helpers for services over real HTTP on loopback.
//
// Serving<T> constructs T (anything with Bind/Serve/Stop), binds it to 127.0.0.1:0 and serves
// on a thread until destroyed. The socket listens once Bind returns, so a client may connect
// at once (no sleeping). Call() sends one request the way callers of our services do.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "common/http/problem.hpp"
#include "common/net.hpp"
#include "demo/stack.hpp"

namespace test_support {

// Serving<T>(AtPort{p}, args...) binds a given port instead (one chosen with
// idemsaga::common::FreeLoopbackPort()).
struct AtPort {
  int port;
};

template <typename T>
class Serving {
 public:
  template <typename... Args>
  explicit Serving(Args&&... args) : Serving(AtPort{0}, std::forward<Args>(args)...) {}
  template <typename... Args>
  explicit Serving(AtPort at, Args&&... args)
      : service(std::forward<Args>(args)...),
        port(service.Bind("127.0.0.1", at.port)),
        thread([this] { service.Serve(); }) {}
  ~Serving() {
    service.Stop();
    thread.join();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port); }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(20);
    return c;
  }

  T service;
  int port;
  std::thread thread;
};

struct Call {
  std::string key;
  std::string body;
  std::string tenant = "demo";                        // X-Tenant-ID (participants); "" omits it
  std::string token = idemsaga::demo::kServiceToken;  // Bearer token; "" omits it
  std::string content_type = "application/json";
  httplib::Headers extra = {};
};

inline httplib::Result Post(httplib::Client& client, const std::string& path, const Call& call) {
  httplib::Headers headers = call.extra;
  if (!call.token.empty()) headers.emplace("Authorization", "Bearer " + call.token);
  if (!call.tenant.empty()) headers.emplace("X-Tenant-ID", call.tenant);
  if (!call.key.empty()) headers.emplace("Idempotency-Key", call.key);
  return client.Post(path.c_str(), headers, call.body, call.content_type.c_str());
}

// Order bodies as the README shows them.
inline constexpr const char* kOrder =
    R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":2}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_visa"})";
inline constexpr const char* kDeclinedOrder =
    R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":2}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_declined"})";

// A POST /v1/orders call as a tenant (the API key is the bearer token; no X-Tenant-ID).
inline Call Order(std::string key, std::string body = kOrder,
                  std::string api_key = "dev-key-demo") {
  return Call{
      .key = std::move(key), .body = std::move(body), .tenant = "", .token = std::move(api_key)};
}

// The `error.code` of a JSON error body, or a marker when the body is not one.
inline std::string ErrorCode(const httplib::Result& r) {
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("code") ||
      j["type"] != "https://idemsaga.dev/problems/" + j["code"].get<std::string>()) {
    return "<not a problem body: " + r->body + ">";
  }
  return j["code"].get<std::string>();
}

// Expects the answer every edge gives an outage (common::Failure::kUnavailable), byte for
// byte: 503, Retry-After, and the problem body that says a retry with the same key is safe.
inline void ExpectOutageAnswer(const httplib::Result& r) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/problem+json");
  EXPECT_EQ(r->body, idemsaga::common::http::ProblemBody(
                         503, "unavailable",
                         "the database is unavailable; retrying with the same key is safe"));
}

}  // namespace test_support
