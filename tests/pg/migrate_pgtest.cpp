#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using test_support::ScratchDatabase;

const std::filesystem::path kSqlDir = IDEMSAGA_SQL_DIR;

int MigrationsOf(const std::string& kind) {
  int n = 0;
  for (const auto& set : idemsaga::common::pg::SetsFor(kind)) {
    for (const auto& m : idemsaga::common::pg::AllMigrations()) n += m.set == set ? 1 : 0;
  }
  return n;
}

// Every set of every kind: embedded, numbered 1..n without a gap, one per file in sql/<set>/
// (a file the build did not embed would otherwise go unnoticed until a database lacked it),
// and a fresh database of the kind records exactly those migrations in its ledger.
TEST(Migrate, EveryKindHasEmbeddedMigrations) {
  for (const auto& kind : idemsaga::common::pg::DatabaseKinds()) {
    for (const auto& set : idemsaga::common::pg::SetsFor(kind)) {
      std::vector<int> versions;
      for (const auto& m : idemsaga::common::pg::AllMigrations()) {
        if (m.set == set) versions.push_back(m.version);
      }
      EXPECT_FALSE(versions.empty()) << kind << ": no migrations of set " << set;
      for (size_t i = 0; i < versions.size(); ++i) {
        EXPECT_EQ(versions[i], static_cast<int>(i) + 1) << kind << ": set " << set;
      }
      size_t files = 0;
      for (const auto& f : std::filesystem::directory_iterator(kSqlDir / set)) {
        files += f.path().extension() == ".sql" ? 1 : 0;
      }
      EXPECT_EQ(versions.size(), files) << kind << ": set " << set << " vs " << kSqlDir / set;
    }
    ScratchDatabase db(kind);
    EXPECT_EQ(db.Count("SELECT count(*) FROM schema_migrations"), MigrationsOf(kind)) << kind;
  }
}

TEST(Migrate, AScratchDatabaseIsFullyMigratedAndASecondRunAppliesNothing) {
  ScratchDatabase db("inventory");
  EXPECT_EQ(db.Count("SELECT count(*) FROM schema_migrations"), MigrationsOf("inventory"));
  pqxx::connection conn(db.url());
  EXPECT_EQ(idemsaga::common::pg::Migrate(conn, "inventory"), 0);
}

TEST(Migrate, ParticipantsGetTheGuardTableAndTheirOwnTablesOnly) {
  ScratchDatabase payment("payment");
  EXPECT_EQ(payment.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(payment.Count("SELECT count(*) FROM charges"), 0);
  EXPECT_EQ(payment.Count("SELECT count(*) FROM pg_tables WHERE tablename = 'reservations'"), 0);
  ScratchDatabase inventory("inventory");
  EXPECT_EQ(inventory.Count("SELECT available FROM stock WHERE sku = 'widget'"), 1000000);
  EXPECT_EQ(inventory.Count("SELECT available FROM stock WHERE sku = 'gadget'"), 10);
  ScratchDatabase shipping("shipping");
  EXPECT_EQ(shipping.Count("SELECT count(*) FROM idempotency_keys"), 0);
  EXPECT_EQ(shipping.Count("SELECT count(*) FROM shipments"), 0);
  EXPECT_EQ(shipping.Count("SELECT count(*) FROM pg_tables WHERE tablename IN "
                           "('charges', 'reservations', 'stock_slots')"),
            0);
  EXPECT_EQ(shipping.Count("SELECT count(*) FROM schema_migrations "
                           "WHERE set_name NOT IN ('guard', 'shipping')"),
            0);
  // The row the shipping participant writes passes every rule of its table.
  shipping.Exec(
      "INSERT INTO shipments (shipment_id, tenant_id, idempotency_key, reservation_id, address, "
      "status) VALUES ('shp_' || replace(gen_random_uuid()::text, '-', ''), 't', 'k', 'res_' || "
      "repeat('0', 32), '{\"name\":\"A\",\"country\":\"FR\"}', 'created')");
  EXPECT_EQ(shipping.Count("SELECT count(*) FROM shipments"), 1);
}

TEST(Migrate, RefusesADatabaseWhoseAppliedMigrationWasEdited) {
  ScratchDatabase db("payment");
  db.Exec("UPDATE schema_migrations SET checksum = 'edited' WHERE set_name = 'payment'");
  pqxx::connection conn(db.url());
  EXPECT_THROW(idemsaga::common::pg::Migrate(conn, "payment"), std::runtime_error);
}

TEST(Migrate, ConcurrentRunnersOnAnEmptyDatabaseApplyEachMigrationOnce) {
  ScratchDatabase scratch("payment");
  // A database with no schema at all: create a new empty one next to the scratch copy.
  std::string url = idemsaga::common::pg::WithDatabase(
      scratch.url(), idemsaga::common::pg::DatabaseOf(scratch.url()) + "_empty");
  idemsaga::common::pg::CreateDatabaseIfMissing(scratch.url(),
                                                idemsaga::common::pg::DatabaseOf(url));
  int applied[2] = {0, 0};
  std::thread a([&] {
    pqxx::connection c(url);
    applied[0] = idemsaga::common::pg::Migrate(c, "payment");
  });
  std::thread b([&] {
    pqxx::connection c(url);
    applied[1] = idemsaga::common::pg::Migrate(c, "payment");
  });
  a.join();
  b.join();
  EXPECT_EQ(applied[0] + applied[1], MigrationsOf("payment"));
  EXPECT_TRUE(applied[0] == 0 || applied[1] == 0);
  {
    pqxx::connection admin(idemsaga::common::pg::WithDatabase(url, "postgres"));
    pqxx::nontransaction tx(admin);
    tx.exec("DROP DATABASE " + tx.quote_name(idemsaga::common::pg::DatabaseOf(url)) +
            " WITH (FORCE)");
  }
}

// The rules on stored rows (domains since orchestrator V005, guard V002, payment V002,
// inventory V003, shipping V001): each statement breaks one rule of a row that is otherwise
// valid.
TEST(Migrate, TheSchemasRefuseRowsThatBreakTheirRules) {
  const std::string hash(64, 'a');
  const std::string hex(32, 'c');
  // A shipment row valid but for the one value given wrong.
  auto shipment = [](const std::string& id, const std::string& reservation,
                     const std::string& address, const std::string& status) {
    return "INSERT INTO shipments (shipment_id, tenant_id, idempotency_key, reservation_id, "
           "address, status) VALUES (" +
           id + ", 't', 'k', " + reservation + ", " + address + ", " + status + ")";
  };
  const std::string key_row =
      "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, status, "
      "response_status, response_content_type, response_body) VALUES ";
  const std::map<std::string, std::vector<std::string>> bad = {
      {"inventory",
       {key_row + "('bad tenant', 'k', '" + hash + "', 'completed', 201, 'a/b', '{}')",
        key_row + "('t', '', '" + hash + "', 'completed', 201, 'a/b', '{}')",
        key_row + "('t', 'k', 'ABC', 'completed', 201, 'a/b', '{}')",
        key_row + "('t', 'k', '" + hash + "', 'done', 201, 'a/b', '{}')",
        key_row + "('t', 'k', '" + hash + "', 'completed', 99, 'a/b', '{}')",
        key_row + "('t', 'k', '" + hash + "', 'completed', NULL, 'a/b', '{}')",
        key_row + "('t', 'k', NULL, 'completed', 201, 'a/b', '{}')",
        "UPDATE stock_slots SET available = -1 WHERE sku = 'widget' AND slot = 0",
        "INSERT INTO stock_slots VALUES ('Bad SKU', 0, 1, 0)",
        "INSERT INTO stock_slots VALUES ('new', 16, 1, 0)",
        "INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status) "
        "VALUES ('r', 't', 'k', '[]', 'held')",
        "INSERT INTO reservations (reservation_id, tenant_id, idempotency_key, items, status) "
        "VALUES ('r', 't', 'k', '[]', 'released')"}},
      {"payment",
       {"INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents, "
        "currency, payment_method, status) VALUES ('c', 't', 'k', 'u', 0, 'EUR', 'pm', 'captured')",
        "INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents, "
        "currency, payment_method, status) VALUES ('c', 't', 'k', 'u', 1, 'eur', 'pm', 'captured')",
        "INSERT INTO charges (charge_id, tenant_id, idempotency_key, customer_id, amount_cents, "
        "currency, payment_method, status) VALUES ('c', 't', 'k', 'u', 1, 'EUR', 'pm', "
        "'refunded')"}},
      {"shipping",
       {shipment("'shp_1'", "'res_" + hex + "'", "'{\"country\":\"FR\"}'", "'created'"),
        shipment("'shp_" + hex + "'", "'res_1'", "'{\"country\":\"FR\"}'", "'created'"),
        shipment("'shp_" + hex + "'", "'res_" + hex + "'", "'[]'", "'created'"),
        shipment("'shp_" + hex + "'", "'res_" + hex + "'", "'{\"country\":\"fr\"}'", "'created'"),
        shipment("'shp_" + hex + "'", "'res_" + hex + "'", "'{\"country\":\"FR\"}'", "'shipped'"),
        shipment("'shp_" + hex + "'", "'res_" + hex + "'", "'{\"country\":\"FR\"}'",
                 "'cancelled'")}},
  };
  for (const auto& [kind, statements] : bad) {
    ScratchDatabase db(kind);
    for (const auto& sql : statements) {
      EXPECT_THROW(db.Exec(sql), pqxx::check_violation) << kind << ": " << sql;
    }
  }
  // The orchestrator's saga rows: a valid running row, then one rule broken at a time.
  ScratchDatabase db("orchestrator");
  db.Exec("INSERT INTO tenants (tenant_id, api_key_hash) VALUES ('t', '" + hash + "')");
  auto row = [&](const std::string& key, const std::string& trace, const std::string& status,
                 const std::string& lease, const std::string& response) {
    return "INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, request_body, "
           "saga_name, order_id, status, lease_expires_at, response_status, trace_id, "
           "expires_at) VALUES ('t', " +
           key + ", '" + hash + "', '{}', 's', 'o' || " + key + ", " + status + ", " + lease +
           ", " + response + ", " + trace + ", now())";
  };
  const std::string trace = "'" + std::string(32, 'b') + "'";
  db.Exec(row("'ok'", trace, "'started'", "now()", "NULL"));
  for (const auto& sql : {
           row("''", trace, "'started'", "now()", "NULL"),
           row("'k1'", "'xyz'", "'started'", "now()", "NULL"),
           row("'k2'", trace, "'paused'", "now()", "NULL"),
           row("'k3'", trace, "'started'", "NULL", "NULL"),
           row("'k4'", trace, "'completed'", "NULL", "201"),  // finished without completed_at
           row("'k5'", trace, "'started'", "now()", "700"),
       }) {
    EXPECT_THROW(db.Exec(sql), pqxx::check_violation) << sql;
  }
  EXPECT_THROW(db.Exec("UPDATE idempotency_keys SET lease_epoch = 0"), pqxx::check_violation);
  EXPECT_THROW(db.Exec("UPDATE idempotency_keys SET root_span_id = 'nothex'"),
               pqxx::check_violation);
}

TEST(Migrate, UnknownKindIsRefused) {
  EXPECT_THROW(idemsaga::common::pg::SetsFor("billing"), std::invalid_argument);
}

}  // namespace
