// Tenants on several clusters: what a service of one cluster serves, read from a real
// directory database (common/pg/placement.hpp), and a tenant moved between two clusters' worth
// of databases (app/tenant_move.hpp), its rows compared field by field.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include "app/tenant_move.hpp"
#include "common/crypto.hpp"
#include "common/pg/placement.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/wait.hpp"

namespace {

using idemsaga::common::Misplaced;
using idemsaga::common::pg::Placement;
using test_support::ScratchDatabase;
using Role = Placement::Role;

// Where `tenant` is placed by a refusal to serve it here ("served" if there is none).
std::string Refusal(const Placement& p, const std::string& tenant, Role role) {
  try {
    p.Require(tenant, role);
    return "served";
  } catch (const Misplaced& e) {
    return "refused:" + e.cluster();
  }
}

void Place(const ScratchDatabase& dir, const std::string& tenant, const std::string& cluster,
           const std::string& state = "active", const std::string& moving_to = "") {
  dir.Exec(
      "INSERT INTO tenant_placement (tenant_id, cluster, state, moving_to) "
      "VALUES ($1, $2, $3, nullif($4, '')) ON CONFLICT (tenant_id) DO UPDATE "
      "SET cluster = $2, state = $3, moving_to = nullif($4, '')",
      tenant, cluster, state, moving_to);
}

TEST(Placement, ServesOnlyTheTenantsPlacedOnItsOwnCluster) {
  ScratchDatabase dir("directory");
  Place(dir, "acme", "c1");
  Place(dir, "globex", "c2");
  Placement c1({.directory_url = dir.url(), .cluster = "c1"});
  EXPECT_EQ(Refusal(c1, "acme", Role::kIntake), "served");
  EXPECT_EQ(Refusal(c1, "acme", Role::kParticipant), "served");
  // Placed elsewhere: refused, naming where it is, so that a front can route it.
  EXPECT_EQ(Refusal(c1, "globex", Role::kIntake), "refused:c2");
  EXPECT_EQ(Refusal(c1, "globex", Role::kParticipant), "refused:c2");
  EXPECT_EQ(Refusal(c1, "initech", Role::kIntake), "refused:");
}

TEST(Placement, ADrainingTenantReachesOnlyItsParticipantsAndAFrozenOneNothing) {
  ScratchDatabase dir("directory");
  Place(dir, "acme", "c1", "draining", "c2");
  Placement c1({.directory_url = dir.url(), .cluster = "c1"});
  Placement c2({.directory_url = dir.url(), .cluster = "c2"});
  EXPECT_EQ(Refusal(c1, "acme", Role::kIntake), "refused:c1");
  EXPECT_EQ(Refusal(c1, "acme", Role::kParticipant), "served");  // its running sagas finish
  EXPECT_EQ(Refusal(c2, "acme", Role::kParticipant), "refused:c1");
  Place(dir, "acme", "c1", "frozen", "c2");
  ASSERT_TRUE(c1.Refresh());
  EXPECT_EQ(Refusal(c1, "acme", Role::kIntake), "refused:c1");
  EXPECT_EQ(Refusal(c1, "acme", Role::kParticipant), "refused:c1");
  // The switch: read by each service at its next refresh.
  Place(dir, "acme", "c2");
  EXPECT_TRUE(test_support::WaitFor([&] { return Refusal(c2, "acme", Role::kIntake) == "served"; },
                                    std::chrono::seconds(10)));
  EXPECT_TRUE(
      test_support::WaitFor([&] { return Refusal(c1, "acme", Role::kParticipant) == "refused:c2"; },
                            std::chrono::seconds(10)));
}

// The bound a move relies on: a copy older than max_age is no longer trusted, so a service
// cut off from the directory cannot go on serving a tenant that has moved meanwhile.
TEST(Placement, RefusesEveryTenantWhileTheDirectoryCannotBeReadAndServesAgainAfter) {
  ScratchDatabase dir("directory");
  Place(dir, "acme", "c1");
  Placement c1({.directory_url = dir.url(),
                .cluster = "c1",
                .refresh = std::chrono::milliseconds(50),
                .max_age = std::chrono::milliseconds(400)});
  ASSERT_EQ(Refusal(c1, "acme", Role::kIntake), "served");
  dir.Exec("ALTER TABLE tenant_placement RENAME TO tenant_placement_away");
  EXPECT_FALSE(c1.Refresh());
  EXPECT_TRUE(
      test_support::WaitFor([&] { return Refusal(c1, "acme", Role::kParticipant) == "refused:"; },
                            std::chrono::seconds(10)));
  dir.Exec("ALTER TABLE tenant_placement_away RENAME TO tenant_placement");
  EXPECT_TRUE(test_support::WaitFor([&] { return Refusal(c1, "acme", Role::kIntake) == "served"; },
                                    std::chrono::seconds(10)));
}

TEST(Placement, FlagsGoTogetherAndNoneMeansOneClusterForAll) {
  EXPECT_EQ(Placement::FromFlags("", ""), nullptr);
  EXPECT_THROW(Placement::FromFlags("postgresql://127.0.0.1/dir", ""), std::invalid_argument);
  EXPECT_THROW(Placement::FromFlags("", "c1"), std::invalid_argument);
  EXPECT_THROW(Placement::FromFlags("postgresql://127.0.0.1/dir", "C 1"), std::invalid_argument);
}

// Every table of the tenant's, compared between two databases: the rows as text, in key order.
std::string RowsOf(const ScratchDatabase& db, const std::string& table, const std::string& tenant) {
  return db.Text("SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '') FROM " + table +
                     " t WHERE tenant_id = $1",
                 tenant);
}

TEST(TenantMove, CopiesEveryRowOfTheTenantSwitchesAndDeletesTheSourceRows) {
  ScratchDatabase dir("directory");
  ScratchDatabase src_orch("orchestrator"), dst_orch("orchestrator");
  ScratchDatabase src_pay("payment"), dst_pay("payment");
  Place(dir, "acme", "c1");
  for (const auto* db : {&src_orch, &dst_orch}) {
    db->Exec("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ('acme', $1), ('globex', $2)",
             idemsaga::common::Sha256Hex("k-acme"), idemsaga::common::Sha256Hex("k-globex"));
  }
  // A finished saga of each tenant, with an event and spans, and each one's charge and key.
  for (const std::string tenant : {"acme", "globex"}) {
    std::string trace = tenant == "acme" ? std::string(32, 'a') : std::string(32, 'b');
    src_orch.Exec(
        "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body, "
        "saga_name, order_id, status, steps, response_status, response_headers, response_body, "
        "trace_id, completed_at, expires_at, waiting_for) VALUES ($1, 'k1', $2, '{\"a\": 1}', "
        "'place_order', $1 || '-o1', 'completed', '[{\"step\": \"payment\"}]', 201, "
        "'{\"Location\": \"/x\"}', '{\"status\":\"completed\"}', $3, now(), "
        "now() + interval '1 day', '{ready}')",
        tenant, std::string(64, 'c'), trace);
    src_orch.Exec("INSERT INTO trace_spans (trace_id, spans) VALUES ($1, '[{\"span_id\": \"1\"}]')",
                  trace);
    src_pay.Exec(
        "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, status, "
        "response_status, response_content_type, response_body) VALUES ($1, 'k1-payment', $2, "
        "'completed', 201, 'application/json', '{\"charge\": 1}')",
        tenant, std::string(64, 'd'));
    src_pay.Exec(
        "INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents, "
        "currency, payment_method, status) VALUES ($1 || '-ch', $1, 'k1-payment', 'cust', 1000, "
        "'EUR', 'pm_card_visa', 'captured')",
        tenant);
  }
  src_orch.Exec(
      "INSERT INTO saga_events (tenant_id, idempotency_key, name, event_key, request_hash, "
      "payload, response_status, response_body) VALUES ('acme', 'k1', 'ready', 'e1', $1, '{}', "
      "202, '{}')",
      std::string(64, 'e'));
  std::map<std::string, std::string> before;
  for (const auto& table : {"idempotency_keys", "saga_events"}) {
    before[table] = RowsOf(src_orch, table, "acme");
  }
  before["charges"] = RowsOf(src_pay, "charges", "acme");
  before["payment_keys"] = RowsOf(src_pay, "idempotency_keys", "acme");

  auto report = idemsaga::app::TenantMove({.tenant = "acme",
                                           .to = "c2",
                                           .directory_url = dir.url(),
                                           .databases = {{src_orch.url(), dst_orch.url()},
                                                         {src_pay.url(), dst_pay.url()}}})
                    .Run();

  EXPECT_EQ(report.from, "c1");
  EXPECT_EQ(dir.Text("SELECT cluster || '/' || state FROM tenant_placement"), "c2/active");
  for (const auto& table : {"idempotency_keys", "saga_events"}) {
    EXPECT_EQ(RowsOf(dst_orch, table, "acme"), before[table]) << table;
    EXPECT_EQ(
        src_orch.Count(std::string("SELECT count(*) FROM ") + table + " WHERE tenant_id = 'acme'"),
        0)
        << table;
  }
  EXPECT_EQ(RowsOf(dst_pay, "charges", "acme"), before["charges"]);
  EXPECT_EQ(RowsOf(dst_pay, "idempotency_keys", "acme"), before["payment_keys"]);
  EXPECT_EQ(src_pay.Count("SELECT count(*) FROM charges WHERE tenant_id = 'acme'"), 0);
  EXPECT_EQ(
      dst_orch.Count("SELECT count(*) FROM trace_spans WHERE trace_id = $1", std::string(32, 'a')),
      1);
  // The other tenant is untouched, and the credentials stay where they were.
  EXPECT_EQ(src_orch.Count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'globex'"), 1);
  EXPECT_EQ(dst_orch.Count("SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'globex'"), 0);
  EXPECT_EQ(src_orch.Count("SELECT count(*) FROM tenants WHERE tenant_id = 'acme'"), 1);
}

TEST(TenantMove, IsCalledOffWhenASagaDoesNotFinishAndTheTenantStaysWhereItWas) {
  ScratchDatabase dir("directory");
  ScratchDatabase src("orchestrator"), dst("orchestrator");
  Place(dir, "acme", "c1");
  src.Exec("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ('acme', $1)",
           idemsaga::common::Sha256Hex("k-acme"));
  src.Exec(
      "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body, "
      "saga_name, order_id, status, trace_id, lease_owner, lease_expires_at, expires_at) VALUES "
      "('acme', 'k1', $1, '{}', 'place_order', 'o1', 'started', $2, 'elsewhere', "
      "now() + interval '1 hour', now() + interval '1 day')",
      std::string(64, 'c'), std::string(32, 'a'));
  idemsaga::app::TenantMove move({.tenant = "acme",
                                  .to = "c2",
                                  .directory_url = dir.url(),
                                  .databases = {{src.url(), dst.url()}},
                                  .drain_timeout = std::chrono::milliseconds(300)});
  EXPECT_THROW(move.Run(), std::runtime_error);
  EXPECT_EQ(dir.Text("SELECT cluster || '/' || state FROM tenant_placement"), "c1/active");
  EXPECT_EQ(dst.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(src.Count("SELECT count(*) FROM idempotency_keys"), 1);
}

}  // namespace
