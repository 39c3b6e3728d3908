// The whole stack over real HTTP on loopback, in process: the orchestrator and the three demo
// participants, each on a fresh database of the run's PostgreSQL; tenants `demo` and `acme`
// (API keys dev-key-demo, dev-key-acme). Link idemsaga_orchestrator and idemsaga_demo.
//   test_support::Stack stack;   // or Stack([](auto& o) { o.sagas.threads = 4; })
//   auto c = stack.orch.Client();
#pragma once

#include <functional>
#include <vector>

#include "common/crypto.hpp"
#include "demo/service.hpp"
#include "orchestrator/orchestrator.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace test_support {

// An order body as POST /v1/orders takes it, paid by `method` (pm_card_visa, pm_card_3ds,
// pm_card_declined), for `quantity` of `sku`.
inline std::string OrderPaidBy(const std::string& method, const std::string& sku = "widget",
                               int quantity = 2) {
  return R"({"customer_id":"cust_1","items":[{"sku":")" + sku + R"(","quantity":)" +
         std::to_string(quantity) +
         R"(}],"amount_cents":2500,"currency":"USD","payment_method":")" + method + R"("})";
}

struct Stack {
  using Adjust = std::function<void(idemsaga::orchestrator::OrchestratorOptions&)>;

  // `sagas`: what the orchestrator serves (the shipped sagas, with options of the test's, or
  // sagas of its own beside them).
  explicit Stack(const Adjust& adjust = {}, const std::vector<idemsaga::steps::SagaFactory>& sagas =
                                                idemsaga::steps::ShippedSagas())
      : orch_db("orchestrator"),
        inv_db("inventory"),
        pay_db("payment"),
        ship_db("shipping"),
        inventory(idemsaga::demo::ParticipantKind::kInventory, inv_db.url(),
                  idemsaga::demo::ParticipantOptions{}),
        payment(idemsaga::demo::ParticipantKind::kPayment, pay_db.url(),
                idemsaga::demo::ParticipantOptions{}),
        shipping(idemsaga::demo::ParticipantKind::kShipping, ship_db.url(),
                 idemsaga::demo::ParticipantOptions{}),
        orch(
            [&] {
              auto o = DemoOrchestratorOptions(orch_db.url(), {{"inventory", inventory.Url()},
                                                               {"payment", payment.Url()},
                                                               {"shipping", shipping.Url()}});
              if (adjust) adjust(o);
              return o;
            }(),
            sagas) {
    orch.service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
    orch.service.store().UpsertTenant("acme", idemsaga::common::Sha256Hex("dev-key-acme"));
  }

  // Where the charge made under `key`-payment stands: requires_action, captured, refunded,
  // or none.
  std::string ChargeStatus(const std::string& key) const {
    for (const auto& status : {"requires_action", "captured", "refunded"}) {
      if (pay_db.Count("SELECT count(*) FROM charges WHERE idempotency_key = $1 AND status = $2",
                       key + "-payment", std::string(status)) == 1) {
        return status;
      }
    }
    return "none";
  }

  ScratchDatabase orch_db, inv_db, pay_db, ship_db;
  Serving<idemsaga::demo::ParticipantService> inventory, payment, shipping;
  Serving<idemsaga::orchestrator::Orchestrator> orch;
};

// A running saga written straight into the orchestrator's database, as the runner records
// one, with its lease held by another replica for an hour (so nothing here runs it until an
// operator acts): `status` started or compensating, `steps` the runner's JSON step records.
struct SeededSaga {
  std::string key;
  std::string saga = "place_order";
  std::string status = "started";
  bool stuck = false;
  std::string steps = "[]";
  std::string failed_step;  // "" for none
  int created_seconds_ago = 0;
  std::string tenant = "demo";
};
inline void SeedSaga(const ScratchDatabase& db, const SeededSaga& s) {
  db.Exec(R"sql(
    INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body,
      saga_name, order_id, status, lease_owner, lease_epoch, lease_expires_at, steps, stuck,
      failed_step, trace_id, created_at, expires_at)
    VALUES ($1::text, $2::text, encode(sha256(convert_to($2::text, 'UTF8')), 'hex'), '{}',
      $3::text, 'ord_' || md5($2::text), $4::text, 'replica-b', 1, now() + interval '1 hour',
      $5::jsonb, $6::boolean, nullif($7::text, ''), md5('trace' || $2::text),
      now() - make_interval(secs => $8::int), now() + interval '1 day'))sql",
          s.tenant, s.key, s.saga, s.status, s.steps, s.stuck, s.failed_step,
          s.created_seconds_ago);
}

}  // namespace test_support
