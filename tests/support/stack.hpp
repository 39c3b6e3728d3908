// The whole stack over real HTTP on loopback, in process: the orchestrator and the three demo
// participants, each on a fresh database of the run's PostgreSQL; tenants `demo` and `acme`
// (API keys dev-key-demo, dev-key-acme). Link idemsaga_orchestrator and idemsaga_services_mock.
//   test_support::Stack stack;   // or Stack([](auto& o) { o.sagas.threads = 4; })
//   auto c = stack.orch.Client();
#pragma once

#include <functional>

#include "common/crypto.hpp"
#include "orchestrator/orchestrator.hpp"
#include "services_mock/service.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace test_support {

struct Stack {
  using Adjust = std::function<void(orchestrator::OrchestratorOptions&)>;

  explicit Stack(const Adjust& adjust = {})
      : orch_db("orchestrator"),
        inv_db("inventory"),
        pay_db("payment"),
        ship_db("shipping"),
        inventory(services_mock::ParticipantKind::kInventory, inv_db.url(),
                  services_mock::ParticipantOptions{}),
        payment(services_mock::ParticipantKind::kPayment, pay_db.url(),
                services_mock::ParticipantOptions{}),
        shipping(services_mock::ParticipantKind::kShipping, ship_db.url(),
                 services_mock::ParticipantOptions{}),
        orch([&] {
          orchestrator::OrchestratorOptions o;
          o.database_url = orch_db.url();
          o.participants["inventory"].base_url = inventory.Url();
          o.participants["payment"].base_url = payment.Url();
          o.participants["shipping"].base_url = shipping.Url();
          if (adjust) adjust(o);
          return o;
        }()) {
    orch.service.store().UpsertTenant("demo", common::Sha256Hex("dev-key-demo"));
    orch.service.store().UpsertTenant("acme", common::Sha256Hex("dev-key-acme"));
  }

  ScratchDatabase orch_db, inv_db, pay_db, ship_db;
  Serving<services_mock::ParticipantService> inventory, payment, shipping;
  Serving<orchestrator::Orchestrator> orch;
};

}  // namespace test_support
