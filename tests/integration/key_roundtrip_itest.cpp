// The keys' round trip, as a property over the whole accepted alphabet: for generated parent
// keys (quotes, escapes, spaces, %, +, commas, both length limits), the keys that reach the
// participants' tables are exactly the parent's derived keys, byte for byte; distinct parents
// never share a participant key; and a declined order leaves stock and charges as they were.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/crypto.hpp"
#include "common/idempotency_key.hpp"
#include "common/percent_encode.hpp"
#include "demo/service.hpp"
#include "orchestrator/orchestrator.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using test_support::Call;
using test_support::Order;
using test_support::ScratchDatabase;
using test_support::Serving;

// Keys a client may send, biased towards the bytes that broke earlier builds.
std::string GenerateKey(std::mt19937& rng, int i) {
  static const std::string kNasty = "%+, \"\\;=:/?#&'";
  static const std::vector<std::string> kFixed = {
      "pct%41-X", "dk%2541-X", "dkA-X", " lead-X", "lead-X", "trail ", "a\"b", "a\\\"b", "x,y",
      "plus+key", "%00", "%FF", "a-inventory",
      // A key ending like a sub-resource must never reach that sub-resource of another key.
      "k", "k/trace", "k/trace/trace", "s/retry"};
  if (i < static_cast<int>(kFixed.size())) return kFixed[i];
  size_t len = i % 17 == 0 ? idemsaga::orchestrator::kMaxParentKeyLength : 1 + rng() % 24;
  std::string key;
  for (size_t j = 0; j < len; ++j) {
    key.push_back(rng() % 2 == 0 ? kNasty[rng() % kNasty.size()]
                                 : static_cast<char>(0x20 + rng() % 95));
  }
  return key;
}

TEST(KeyRoundTrip, EveryParentKeyReachesEveryParticipantAsExactlyItsDerivedKeys) {
  ScratchDatabase orch_db("orchestrator"), inv_db("inventory"), pay_db("payment");
  Serving<ParticipantService> inventory(ParticipantKind::kInventory, inv_db.url(),
                                        idemsaga::demo::ParticipantOptions{});
  Serving<ParticipantService> payment(ParticipantKind::kPayment, pay_db.url(),
                                      idemsaga::demo::ParticipantOptions{});
  auto options = test_support::DemoOrchestratorOptions(
      orch_db.url(), {{"inventory", inventory.Url()}, {"payment", payment.Url()}});
  options.trace_settle = std::chrono::milliseconds(0);  // the trace's key matters, not its spans
  Serving<idemsaga::orchestrator::Orchestrator> orch(options);
  orch.service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
  auto client = orch.Client();

  std::mt19937 rng(20261123);
  std::set<std::string> parents;
  std::set<std::string> expected_inventory, expected_payment;
  int declined = 0;
  constexpr int kKeys = 300;
  for (int i = 0; i < kKeys; ++i) {
    std::string key = GenerateKey(rng, i);
    if (!parents.insert(key).second) continue;
    bool decline = i % 3 == 0;
    // Half the keys as sf-strings (needed for quotes, commas, edge spaces), half bare.
    bool bare = !key.empty() && key.find_first_of("\",;") == std::string::npos &&
                key.front() != ' ' && key.back() != ' ' && rng() % 2 == 0;
    auto r =
        test_support::Post(client, "/v1/orders",
                           Order(bare ? key : idemsaga::common::FormatIdempotencyKey(key),
                                 decline ? test_support::kDeclinedOrder : test_support::kOrder));
    ASSERT_TRUE(r) << key;
    ASSERT_EQ(r->status, decline ? 402 : 201) << "key [" << key << "]: " << r->body;
    EXPECT_EQ(nlohmann::json::parse(r->body)["idempotency_key"], key);
    expected_inventory.insert(key + "-inventory");
    expected_payment.insert(key + "-payment");
    if (decline) {
      ++declined;
      expected_inventory.insert(key + "-inventory-compensate");
    }
  }
  // Each order and its trace, read back by its key in the URL path (percent-encoded, so a
  // key may hold "/"), are that key's and no other's.
  const httplib::Headers auth = {{"Authorization", "Bearer dev-key-demo"}};
  for (const auto& key : parents) {
    const std::string path = "/v1/orders/" + idemsaga::common::PercentEncode(key);
    auto order = client.Get(path.c_str(), auth);
    ASSERT_TRUE(order) << key;
    ASSERT_EQ(order->status, 200) << "key [" << key << "]: " << order->body;
    EXPECT_EQ(nlohmann::json::parse(order->body)["idempotency_key"], key) << order->body;
    auto trace = client.Get((path + "/trace").c_str(), auth);
    ASSERT_TRUE(trace) << key;
    ASSERT_EQ(trace->status, 200) << "key [" << key << "]: " << trace->body;
    EXPECT_EQ(nlohmann::json::parse(trace->body)["idempotency_key"], key);
  }
  // Exactly the derived keys, and nothing else, in each participant's table.
  EXPECT_EQ(inv_db.IdempotencyKeys(), expected_inventory);
  EXPECT_EQ(pay_db.IdempotencyKeys(), expected_payment);
  // Every reservation and charge under its own derived key: no two parents met.
  size_t completed = parents.size() - declined;
  EXPECT_EQ(inv_db.Count("SELECT count(DISTINCT idempotency_key) FROM reservations"),
            static_cast<long long>(parents.size()));
  EXPECT_EQ(inv_db.Count("SELECT count(*) FROM reservations WHERE status = 'released'"), declined);
  EXPECT_EQ(pay_db.Count("SELECT count(*) FROM charges WHERE status = 'captured'"),
            static_cast<long long>(completed));
  EXPECT_EQ(inv_db.Count("SELECT available FROM stock WHERE sku = 'widget'"),
            1000000 - 2 * static_cast<long long>(completed));
  std::cout << "key_roundtrip: parents=" << parents.size() << " declined=" << declined
            << " participant_keys=" << expected_inventory.size() + expected_payment.size()
            << std::endl;
}

}  // namespace
