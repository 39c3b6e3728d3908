// Text the database cannot store, in every JSON string of every route's body: every service's
// example bodies (from its OpenAPI document) with one string (or member name) at a time
// replaced by a NUL, a lone surrogate, invalid UTF-8, a malformed escape, or a string longer
// than any field allows. Each must be refused with a 4xx problem at the edge (the OTLP intake
// may instead accept the batch without what it cannot store): never a 503 inviting a retry
// that fails for ever, never a 5xx, and nothing of it stored (no key, no operator decision,
// no fault setting, no span text).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "demo/stack.hpp"
#include "tests/support/stack.hpp"

namespace {

nlohmann::json Document(const std::string& name) {
  std::ifstream in(std::string(IDEMSAGA_SOURCE_DIR) + "/docs/openapi/" + name + ".json");
  return nlohmann::json::parse(in);
}

// Raw JSON text spliced in where a string stood: none of these can be stored, and none is a
// valid value of any field.
std::vector<std::pair<std::string, std::string>> HostileStrings() {
  return {
      {"NUL inside", R"("nul\u0000inside")"},
      {"NUL alone", R"("\u0000")"},
      {"NUL at the end", R"("x\u0000")"},
      {"lone high surrogate", R"("\ud800")"},
      {"lone low surrogate", R"("\udc00")"},
      {"high surrogate then a letter", R"("\ud800\u0041")"},
      {"low surrogate inside", R"("x\udfffy")"},
      {"invalid UTF-8", "\"\xc3\x28\""},
      {"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
      {"overlong UTF-8", "\"\xc0\xaf\""},
      {"bytes FF FE", "\"\xff\xfe\""},
      {"truncated escape", R"("\u12")"},
      {"non-hex escape", R"("\uZZZZ")"},
      {"unknown escape", R"("\x41")"},
      {"60 KiB", "\"" + std::string(60 * 1024, 'x') + "\""},
      {"1 MiB", "\"" + std::string(1 << 20, 'y') + "\""},
  };
}

constexpr const char* kPlaceholder = "\"@@hostile@@\"";

// Every string value's and member name's position in `doc`, as a function that renders the
// document with that one string replaced by the raw text given.
std::vector<std::function<std::string(const std::string&)>> Splicers(const nlohmann::json& doc) {
  std::vector<std::function<std::string(const std::string&)>> out;
  auto splice = [](std::string text, const std::string& raw) {
    auto at = text.find(kPlaceholder);
    return text.replace(at, std::string(kPlaceholder).size(), raw);
  };
  std::function<void(const nlohmann::json::json_pointer&, const nlohmann::json&)> walk =
      [&](const nlohmann::json::json_pointer& at, const nlohmann::json& node) {
        if (node.is_string()) {
          nlohmann::json copy = doc;
          copy[at] = "@@hostile@@";
          out.push_back(
              [splice, text = copy.dump()](const std::string& raw) { return splice(text, raw); });
        } else if (node.is_array()) {
          for (size_t i = 0; i < node.size(); ++i) walk(at / i, node[i]);
        } else if (node.is_object()) {
          for (const auto& [name, value] : node.items()) {
            nlohmann::json copy = doc;
            copy[at].erase(name);
            copy[at]["@@hostile@@"] = value;
            out.push_back(
                [splice, text = copy.dump()](const std::string& raw) { return splice(text, raw); });
            walk(at / name, value);
          }
        }
      };
  walk(nlohmann::json::json_pointer(), doc);
  return out;
}

struct Route {
  std::string service;  // orchestrator, inventory, payment, shipping
  std::string method;
  std::string path;
  nlohmann::json example;
};

class UnstorableText : public ::testing::Test {
 protected:
  httplib::Client ClientFor(const std::string& service) {
    if (service == "orchestrator") return stack_.orch.Client();
    if (service == "inventory") return stack_.inventory.Client();
    if (service == "payment") return stack_.payment.Client();
    return stack_.shipping.Client();
  }

  test_support::Stack stack_;
};

TEST_F(UnstorableText, EveryStringOfEveryRouteIsRefusedWithA4xxAndNothingIsStored) {
  // A running saga to cancel and a stuck compensation to resolve, both leased to another
  // replica (so only the operator's request could change them).
  test_support::SeedSaga(stack_.orch_db, {.key = "running-1"});
  test_support::SeedSaga(
      stack_.orch_db, {.key = "stuck-resolve-1",
                       .status = "compensating",
                       .stuck = true,
                       .steps = R"([{"name":"inventory","action_key":"stuck-resolve-1-inventory",)"
                                R"("status":"compensating","attempts":1,"compensation_attempts":7,)"
                                R"("detail":"release answered HTTP 500"}])",
                       .failed_step = "payment"});

  // Every route with a JSON body, as its service's document gives it, path parameters filled
  // in from their examples; plus the ship_order saga's body (a nested object).
  std::vector<Route> routes;
  for (const std::string& service : {"orchestrator", "inventory", "payment", "shipping"}) {
    for (const auto& name :
         {service, std::string(service == "orchestrator" ? "" : "participant")}) {
      if (name.empty()) continue;
      auto doc = Document(name);
      for (const auto& [path, ops] : doc["paths"].items()) {
        for (const auto& [method, op] : ops.items()) {
          if (!op.is_object() || !op.contains("requestBody")) continue;
          std::string target = path;
          for (const auto& p : op.value("parameters", nlohmann::json::array())) {
            if (p.value("in", "") != "path") continue;
            auto at = target.find("{" + p["name"].get<std::string>() + "}");
            target.replace(at, p["name"].get<std::string>().size() + 2,
                           p["example"].get<std::string>());
          }
          routes.push_back({service, method, target,
                            op["requestBody"]["content"]["application/json"]["example"]});
        }
      }
    }
  }
  routes.push_back({"orchestrator", "post", "/v1/runs/ship_order",
                    nlohmann::json::parse(
                        R"({"customer_id":"c","items":[{"sku":"widget","quantity":1}],)"
                        R"("amount_cents":100,"currency":"USD","payment_method":"pm_card_visa",)"
                        R"("address":{"name":"A","line1":"1 St","city":"X","postal_code":"1",)"
                        R"("country":"GB"}})")});
  ASSERT_GE(routes.size(), 12u);  // the documents were read

  const auto inventory_keys = stack_.inv_db.IdempotencyKeys();
  const auto payment_keys = stack_.pay_db.IdempotencyKeys();
  const auto shipping_keys = stack_.ship_db.IdempotencyKeys();
  const auto orchestrator_keys = stack_.orch_db.IdempotencyKeys();
  std::map<std::string, std::string> faults;
  for (const std::string& service : {"inventory", "payment", "shipping"}) {
    faults[service] =
        ClientFor(service)
            .Get("/admin/faults",
                 {{"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}})
            ->body;
  }

  int sent = 0, server_errors = 0, unavailable = 0;
  std::map<int, int> by_status;
  std::map<std::string, int> accepted;  // by path
  for (const auto& route : routes) {
    auto client = ClientFor(route.service);
    for (const auto& render : Splicers(route.example)) {
      for (const auto& [what, raw] : HostileStrings()) {
        std::string key = "u-" + std::to_string(sent);
        httplib::Headers headers = {{"Idempotency-Key", key}};
        if (route.service == "orchestrator" && route.path != "/v1/traces") {
          headers.emplace("Authorization", "Bearer dev-key-demo");
        } else {
          headers.emplace("Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken);
          headers.emplace("X-Tenant-ID", "demo");
        }
        std::string body = render(raw);
        auto r = route.method == "put"
                     ? client.Put(route.path.c_str(), headers, body, "application/json")
                     : client.Post(route.path.c_str(), headers, body, "application/json");
        ++sent;
        std::string where = route.method + " " + route.path + " with " + what + ": " +
                            body.substr(0, std::min<size_t>(body.size(), 160));
        ASSERT_TRUE(r) << where;
        ++by_status[r->status];
        if (r->status == 503) ++unavailable;
        if (r->status >= 500) {
          ++server_errors;
          ADD_FAILURE() << r->status << " for " << where << "\n" << r->body;
          continue;
        }
        // The OTLP intake alone may accept such a batch: it ignores members it does not know
        // (as OTLP receivers must) and a resource attribute it cannot read, and stores only
        // the fields it decoded and checked. Every other route refuses each value.
        if (route.path != "/v1/traces") EXPECT_GE(r->status, 400) << where << "\n" << r->body;
        if (r->status < 400) {
          ++accepted[route.path];
          continue;
        }
        auto problem = nlohmann::json::parse(r->body, nullptr, false);
        EXPECT_TRUE(problem.is_object() && problem.contains("code")) << where << "\n" << r->body;
      }
    }
  }
  std::cout << "unstorable_text: routes=" << routes.size() << " requests=" << sent
            << " status_503=" << unavailable << " status_5xx=" << server_errors;
  for (const auto& [status, n] : by_status) std::cout << " " << status << "=" << n;
  for (const auto& [path, n] : accepted) std::cout << " accepted:" << path << "=" << n;
  std::cout << std::endl;
  EXPECT_EQ(unavailable, 0);
  EXPECT_EQ(server_errors, 0);
  EXPECT_GE(sent, 1000);

  // Nothing stored anywhere.
  EXPECT_EQ(stack_.orch_db.IdempotencyKeys(), orchestrator_keys);
  EXPECT_EQ(stack_.inv_db.IdempotencyKeys(), inventory_keys);
  EXPECT_EQ(stack_.pay_db.IdempotencyKeys(), payment_keys);
  EXPECT_EQ(stack_.ship_db.IdempotencyKeys(), shipping_keys);
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM idempotency_keys WHERE "
                                 "cancel_requested IS NOT NULL OR resolution IS NOT NULL"),
            0);
  // Only an OTLP batch is accepted with a member it does not know (as OTLP receivers must):
  // it stores its valid spans as they were decoded, never the unknown member.
  for (const auto& [path, n] : accepted) EXPECT_EQ(path, "/v1/traces") << n;
  EXPECT_LE(stack_.orch_db.Count("SELECT count(*) FROM trace_spans WHERE trace_id = "
                                 "'0af7651916cd43dd8448eb211c80319c'"),
            accepted["/v1/traces"]);
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM trace_spans WHERE spans::text LIKE "
                                 "'%@@%' OR spans::text LIKE '%yyyyyyyy%' OR "
                                 "spans::text LIKE '%xxxxxxxx%' OR spans::text LIKE '%\\u0000%'"),
            0);
  for (const std::string& service : {"inventory", "payment", "shipping"}) {
    EXPECT_EQ(ClientFor(service)
                  .Get("/admin/faults",
                       {{"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}})
                  ->body,
              faults[service])
        << service;
  }
}

// The defect as it was found: a cancel whose reason holds a NUL was a 503 "retrying is safe"
// that failed for ever, with no cancel recorded. Now it is a 400, and the same cancel with a
// storable reason then takes effect.
TEST_F(UnstorableText, ACancelWithANulInItsReasonIsA400AndAFixedOneIsRecorded) {
  test_support::SeedSaga(stack_.orch_db, {.key = "running-2"});
  auto orch = stack_.orch.Client();
  httplib::Headers auth = {{"Authorization", "Bearer dev-key-demo"}};
  for (const char* body :
       {R"({"reason":"nul\u0000inside"})", R"({"reason":"fine","operator":"op\u0000"})"}) {
    auto r = orch.Post("/v1/sagas/running-2/cancel", auth, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body << ": " << r->body;
    EXPECT_EQ(test_support::ErrorCode(r), "invalid_json");
    EXPECT_FALSE(r->has_header("Retry-After"));
  }
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM idempotency_keys WHERE "
                                 "cancel_requested IS NOT NULL"),
            0);
  auto r = orch.Post("/v1/sagas/running-2/cancel", auth, R"({"reason":"customer called"})",
                     "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 202) << r->body;
  EXPECT_EQ(stack_.orch_db.Count("SELECT count(*) FROM idempotency_keys WHERE "
                                 "idempotency_key = 'running-2' AND cancel_requested IS NOT NULL"),
            1);
}

}  // namespace
