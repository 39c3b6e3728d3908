// Hostile input against the real services (orchestrator and both participants over HTTP, each
// on its own PostgreSQL database): thousands of generated malformed bodies and header
// variants per route. Every answer is < 500, and nothing is stored for any request that was
// refused: the keys in each database are exactly those of the requests that were accepted.
#include <gtest/gtest.h>

#include <future>
#include <random>
#include <set>
#include <thread>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "demo/stack.hpp"
#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"

namespace {

// Byte-level and structural mutations of a valid body: most are invalid, a few stay valid
// (and must then be accepted and stored like any other request).
std::string Mutate(const std::string& valid, std::mt19937& rng) {
  static const std::vector<std::string> kWhole = {"",
                                                  "null",
                                                  "[]",
                                                  "{}",
                                                  "\"x\"",
                                                  "1e999",
                                                  "{\"a\":",
                                                  "{{}}",
                                                  "[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]",
                                                  std::string(3000, '['),
                                                  "\xff\xfe",
                                                  "{\"items\":\"\\u0000\"}"};
  static const std::vector<std::string> kValues = {
      "null",
      "-1",
      "0",
      "1e308",
      "-9223372036854775809",
      "18446744073709551616",
      "\"\"",
      "\"\\u0000\"",
      "[]",
      "{}",
      "true",
      "1.5",
      std::string("\"") + std::string(70000, 'x') + "\"",
      "\"\xc3\x28\""};
  std::string body = valid;
  switch (rng() % 6) {
    case 0:
      return kWhole[rng() % kWhole.size()];
    case 1: {  // replace a value after a colon
      std::vector<size_t> colons;
      for (size_t i = 0; i < body.size(); ++i) {
        if (body[i] == ':') colons.push_back(i);
      }
      if (colons.empty()) return body;
      size_t at = colons[rng() % colons.size()] + 1;
      size_t end = body.find_first_of(",}", at);
      if (body[at] == '[' || body[at] == '{') end = at;  // keep structure; insert instead
      return body.substr(0, at) + kValues[rng() % kValues.size()] +
             body.substr(end == std::string::npos ? body.size() : end);
    }
    case 2:  // an unknown field
      return "{\"unexpected\":1," + body.substr(1);
    case 3:  // flip bytes
      for (int m = 0; m < 1 + static_cast<int>(rng() % 3); ++m) {
        body[rng() % body.size()] = static_cast<char>(rng() % 256);
      }
      return body;
    case 4:  // cut
      return body.substr(0, rng() % body.size());
    default:  // duplicate key with another type
      return body.substr(0, body.size() - 1) + ",\"items\":7}";
  }
}

// Header variants for Idempotency-Key: invalid ones must be refused before anything is stored.
httplib::Headers KeyHeaders(std::mt19937& rng, const std::string& prefix, int i,
                            std::string& key_out) {
  std::string key = prefix + std::to_string(i);
  key_out = key;
  switch (rng() % 8) {
    case 0:
      return {};  // missing
    case 1:
      key_out = "";
      return {{"Idempotency-Key", key}, {"Idempotency-Key", key + "b"}};  // twice
    case 2:
      key_out = "";
      return {{"Idempotency-Key", key + ", other"}};  // a list
    case 3:
      key_out = "";
      return {{"Idempotency-Key", "\"" + key + "\";p=1"}};  // parameters
    case 4:
      key_out = "";
      return {{"Idempotency-Key", std::string(300, 'k')}};  // too long
    case 5:
      key_out = "";
      return {{"Idempotency-Key", "\"unterminated"}};
    default:
      return {{"Idempotency-Key", idemsaga::common::FormatIdempotencyKey(key)}};
  }
}

struct Tally {
  int sent = 0;
  int server_errors = 0;
  std::set<std::string> accepted_keys;
  std::set<std::string> action_keys;  // of accepted compensations: tombstoned or undone
};

class HostileInput : public ::testing::Test {
 protected:
  // Sends `n` generated requests to `path` on `client`, each with `auth` headers.
  Tally Storm(httplib::Client& client, const std::string& path, const std::string& valid,
              const httplib::Headers& auth, int n, unsigned seed,
              const std::string& key_prefix = "h-") {
    std::mt19937 rng(seed);
    Tally t;
    for (int i = 0; i < n; ++i) {
      std::string key;
      auto headers = KeyHeaders(rng, key_prefix, i, key);
      headers.insert(auth.begin(), auth.end());
      std::string body = rng() % 8 == 0 ? valid : Mutate(valid, rng);
      const char* type = rng() % 16 == 0 ? "text/plain" : "application/json";
      auto r = client.Post(path.c_str(), headers, body, type);
      ++t.sent;
      if (!r) {
        ADD_FAILURE() << path << ": no answer to " << body.substr(0, 80);
        continue;
      }
      if (r->status >= 500) {
        ++t.server_errors;
        ADD_FAILURE() << path << " " << r->status << " for " << body.substr(0, 120) << ": "
                      << r->body;
      } else if (r->status < 400 || r->status == 402 || r->status == 409) {
        if (!key.empty()) t.accepted_keys.insert(key);  // an answer was stored under the key
        auto parsed = nlohmann::json::parse(body, nullptr, false);
        if (parsed.is_object() && parsed.contains("action_key") &&
            parsed["action_key"].is_string()) {
          t.action_keys.insert(parsed["action_key"].get<std::string>());
        }
      } else if (r->status != 422) {
        auto err = nlohmann::json::parse(r->body, nullptr, false);
        EXPECT_TRUE(!err.is_discarded() && err.contains("code") && err.contains("type"))
            << r->status << " " << r->body;
      }
    }
    return t;
  }

  test_support::Stack stack_;
  test_support::Serving<idemsaga::orchestrator::Orchestrator>& orch_ = stack_.orch;
  test_support::Serving<idemsaga::demo::ParticipantService>&inventory_ = stack_.inventory,
  &payment_ = stack_.payment, &shipping_ = stack_.shipping;
  const test_support::ScratchDatabase &orch_db_ = stack_.orch_db, &inv_db_ = stack_.inv_db,
                                      &pay_db_ = stack_.pay_db, &ship_db_ = stack_.ship_db;
};

TEST_F(HostileInput, ThousandsOfMalformedRequestsPerServiceGetA4xxAndStoreNothing) {
  auto orch = orch_.Client();
  auto inv = inventory_.Client();
  auto pay = payment_.Client();
  httplib::Headers tenant_auth = {{"Authorization", "Bearer dev-key-demo"}};
  httplib::Headers service_auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken},
      {"X-Tenant-ID", "demo"}};
  auto orders = Storm(orch, "/v1/orders", test_support::kOrder, tenant_auth, 1500, 1);
  auto reservations = Storm(inv, "/v1/reservations", R"({"items":[{"sku":"widget","quantity":2}]})",
                            service_auth, 1000, 2);
  auto charges = Storm(pay, "/v1/charges",
                       R"({"amount_cents":2500,"currency":"USD","customer_id":"c",)"
                       R"("payment_method":"pm_card_visa"})",
                       service_auth, 1000, 3);
  auto refunds = Storm(pay, "/v1/refunds", R"({"action_key":"zz-payment"})", service_auth, 500, 4);
  // A saga of the runs API (typed input, a nested address) and its third participant.
  auto ship = shipping_.Client();
  auto runs = Storm(orch, "/v1/runs/ship_order",
                    R"({"customer_id":"c","items":[{"sku":"widget","quantity":1}],)"
                    R"("amount_cents":100,"currency":"USD","payment_method":"pm_card_visa",)"
                    R"("address":{"name":"A","line1":"1 St","city":"X","postal_code":"1",)"
                    R"("country":"GB"}})",
                    tenant_auth, 800, 5, "r-");
  auto shipments = Storm(ship, "/v1/shipments",
                         R"({"reservation_id":"res_0123456789abcdef0123456789abcdef",)"
                         R"("address":{"name":"A","line1":"1 St","city":"X","postal_code":"1",)"
                         R"("country":"GB"}})",
                         service_auth, 800, 6, "s-");

  EXPECT_EQ(orders.server_errors + reservations.server_errors + charges.server_errors +
                refunds.server_errors + runs.server_errors + shipments.server_errors,
            0);
  // Nothing stored for a refused request: each database holds exactly the accepted keys (and,
  // for the orchestrator's, the derived keys they sent on).
  std::set<std::string> orchestrator_keys = orders.accepted_keys;
  orchestrator_keys.insert(runs.accepted_keys.begin(), runs.accepted_keys.end());
  EXPECT_EQ(orch_db_.IdempotencyKeys(), orchestrator_keys);
  std::set<std::string> inventory_keys = reservations.accepted_keys;
  std::set<std::string> payment_keys = charges.accepted_keys;
  std::set<std::string> shipping_keys = shipments.accepted_keys;
  payment_keys.insert(refunds.accepted_keys.begin(), refunds.accepted_keys.end());
  for (const auto& k : orchestrator_keys) {
    inventory_keys.insert(k + "-inventory");
    payment_keys.insert(k + "-payment");
  }
  for (const auto& k : runs.accepted_keys) shipping_keys.insert(k + "-shipping");
  payment_keys.insert(refunds.action_keys.begin(), refunds.action_keys.end());  // tombstones
  EXPECT_EQ(inv_db_.IdempotencyKeys(), inventory_keys);
  EXPECT_EQ(pay_db_.IdempotencyKeys(), payment_keys);
  EXPECT_EQ(ship_db_.IdempotencyKeys(), shipping_keys);
  int sent =
      orders.sent + reservations.sent + charges.sent + refunds.sent + runs.sent + shipments.sent;
  std::cout << "hostile_input: requests=" << sent << " status_5xx="
            << orders.server_errors + reservations.server_errors + charges.server_errors +
                   refunds.server_errors + runs.server_errors + shipments.server_errors
            << " accepted_orders=" << orders.accepted_keys.size()
            << " accepted_runs=" << runs.accepted_keys.size() << std::endl;
}

// The operators' routes: generated decision bodies and listing queries. A completed saga
// cannot be cancelled or resolved, so no request may store a decision, and none may be a 5xx.
TEST_F(HostileInput, OperatorRoutesRefuseMalformedDecisionsAndQueriesWithA4xx) {
  auto orch = orch_.Client();
  httplib::Headers auth = {{"Authorization", "Bearer dev-key-demo"}};
  ASSERT_EQ(test_support::Post(orch, "/v1/orders", test_support::Order("op-1"))->status, 201);
  std::mt19937 rng(7);
  int sent = 0, server_errors = 0;
  auto check = [&](const httplib::Result& r, const std::string& what) {
    ++sent;
    ASSERT_TRUE(r) << what;
    if (r->status >= 500) {
      ++server_errors;
      ADD_FAILURE() << r->status << " for " << what.substr(0, 160) << ": " << r->body;
    }
    EXPECT_GE(r->status, 400) << what;
  };
  for (const auto& [path, valid] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/sagas/op-1/cancel", R"({"reason":"customer called","operator":"bob"})"},
           {"/v1/sagas/op-1/resolve", R"({"note":"refunded by hand","operator":"bob"})"},
           {"/v1/sagas/op-1/retry", R"({})"}}) {
    for (int i = 0; i < 400; ++i) {
      std::string body = i < 12 ? std::vector<std::string>{"[1]",
                                                           "\"x\"",
                                                           "1",
                                                           "true",
                                                           "null",
                                                           "[]",
                                                           "{}",
                                                           "{\"reason\":[]}",
                                                           "{\"note\":{}}",
                                                           "{\"operator\":1}",
                                                           "[{\"reason\":\"r\"}]",
                                                           valid}[i]
                                : Mutate(valid, rng);
      check(orch.Post(path.c_str(), auth, body, "application/json"), path + " " + body);
    }
  }
  const std::vector<std::string> values = {"",
                                           "x",
                                           "started",
                                           "COMPLETED",
                                           "true",
                                           "-1",
                                           "0",
                                           "501",
                                           "1e3",
                                           "%00",
                                           "%ff",
                                           "a%2Fb",
                                           "' OR 1=1 --",
                                           std::string(100, 'a'),
                                           "place_order",
                                           "\xc3\x28"};
  for (int i = 0; i < 600; ++i) {
    std::string query;
    for (const char* name : {"status", "saga", "limit", "stuck"}) {
      if (rng() % 2)
        query +=
            std::string(query.empty() ? "?" : "&") + name + "=" + values[rng() % values.size()];
    }
    auto r = orch.Get(("/v1/sagas" + query).c_str(), auth);
    ++sent;
    ASSERT_TRUE(r) << query;
    if (r->status >= 500) {
      ++server_errors;
      ADD_FAILURE() << r->status << " for " << query << ": " << r->body;
    }
  }
  EXPECT_EQ(server_errors, 0);
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys WHERE cancel_requested IS NOT "
                           "NULL OR resolution IS NOT NULL"),
            0);
  EXPECT_EQ(orch_db_.Text("SELECT status FROM idempotency_keys WHERE idempotency_key = 'op-1'"),
            "completed");
  std::cout << "hostile_input operators: requests=" << sent << " status_5xx=" << server_errors
            << std::endl;
}

}  // namespace

namespace {

// A cancel accepted while the saga's last step runs cannot take effect: the saga completes
// and the client's 201 stands. The operator is told so in the 202, and the saga's record
// says the cancel was too late.
TEST_F(HostileInput, ACancelThatArrivesDuringTheLastStepIsRecordedAsTooLate) {
  payment_.service.faults().Set({.latency_ms = 1500});
  auto orch = orch_.Client();
  std::promise<httplib::Result> answered;
  std::thread order([&] {
    auto c = orch_.Client();
    answered.set_value(test_support::Post(c, "/v1/orders", test_support::Order("late-1")));
  });
  // Inventory answers at once; payment, the last step, takes 1.5 s: once the reservation is
  // stored, the payment call is on its way.
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        return inv_db_.Count(
                   "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = "
                   "'late-1-inventory'") == 1;
      },
      std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  httplib::Headers auth = {{"Authorization", "Bearer dev-key-demo"}};
  auto cancel = orch.Post("/v1/sagas/late-1/cancel", auth, R"({"reason":"customer called"})",
                          "application/json");
  ASSERT_TRUE(cancel);
  EXPECT_EQ(cancel->status, 202) << cancel->body;
  EXPECT_NE(cancel->body.find("too_late"), std::string::npos) << cancel->body;
  auto result = answered.get_future().get();
  order.join();
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 201) << result->body;
  auto view = orch.Get("/v1/orders/late-1", auth);
  ASSERT_TRUE(view);
  auto saga = nlohmann::json::parse(view->body);
  EXPECT_EQ(saga["status"], "completed");
  EXPECT_EQ(saga["cancel_requested"]["outcome"], "too_late") << view->body;
  EXPECT_EQ(saga["cancel_requested"]["reason"], "customer called");
  // The charge stands: a cancel that came too late undid nothing.
  EXPECT_EQ(pay_db_.Count("SELECT count(*) FROM charges WHERE status = 'captured'"), 1);
}

}  // namespace
