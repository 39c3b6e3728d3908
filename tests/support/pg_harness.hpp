// The test suite's PostgreSQL: one real server per test run, a fresh database per test.
//
// The server is, in order: IDEMSAGA_TEST_DATABASE_URL (a server of yours; the URL's user must
// be allowed to CREATE DATABASE), the cluster the CTest fixture started (its URL is in the
// file named by IDEMSAGA_TEST_CLUSTER_FILE), or a temporary cluster this process starts.
// Each kind of database is migrated once per process into a template, and every
// ScratchDatabase is a copy of it, so tests never see each other's rows.
// Thread-safe.
//   test_support::ScratchDatabase db("inventory");
//   EXPECT_EQ(db.Count("SELECT count(*) FROM reservations"), 1);
#pragma once

#include <pqxx/pqxx>
#include <set>
#include <string>

namespace test_support {

const std::string& ServerUrl();

class ScratchDatabase {
 public:
  explicit ScratchDatabase(const std::string& kind);
  ~ScratchDatabase();
  ScratchDatabase(const ScratchDatabase&) = delete;
  ScratchDatabase& operator=(const ScratchDatabase&) = delete;

  const std::string& url() const { return url_; }

  // One integer from a fixed query (counts for assertions).
  template <typename... Args>
  long long Count(const std::string& sql, Args&&... args) const {
    pqxx::connection conn(url_);
    pqxx::nontransaction tx(conn);
    return tx.exec_params1(sql, std::forward<Args>(args)...)[0].template as<long long>();
  }
  // One text value from a fixed query ("" for no row or NULL).
  template <typename... Args>
  std::string Text(const std::string& sql, Args&&... args) const {
    pqxx::connection conn(url_);
    pqxx::nontransaction tx(conn);
    auto rows = tx.exec_params(sql, std::forward<Args>(args)...);
    return rows.empty() ? "" : rows[0][0].template as<std::string>("");
  }
  // Every idempotency key in the database's key table (each service has one).
  std::set<std::string> IdempotencyKeys() const {
    pqxx::connection conn(url_);
    pqxx::nontransaction tx(conn);
    std::set<std::string> keys;
    for (const auto& row : tx.exec("SELECT idempotency_key FROM idempotency_keys")) {
      keys.insert(row[0].as<std::string>());
    }
    return keys;
  }
  // While `on`, every insert into the key table is dropped without an error (a trigger): a
  // claim then finds its key neither claimed nor taken, as when the claimant it waited on keeps
  // rolling back, the race a claim retries and, after a few tries, gives up on.
  void KeyClaimsKeepRacing(bool on) const {
    if (!on) return Exec("DROP TRIGGER claims_keep_racing ON idempotency_keys");
    Exec(R"sql(CREATE OR REPLACE FUNCTION drop_the_insert() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN RETURN NULL; END $$)sql");
    Exec(
        "CREATE TRIGGER claims_keep_racing BEFORE INSERT ON idempotency_keys "
        "FOR EACH ROW EXECUTE FUNCTION drop_the_insert()");
  }
  // Runs a statement (test set-up).
  template <typename... Args>
  void Exec(const std::string& sql, Args&&... args) const {
    pqxx::connection conn(url_);
    pqxx::nontransaction tx(conn);
    tx.exec_params(sql, std::forward<Args>(args)...);
  }

 private:
  std::string name_;
  std::string url_;
};

}  // namespace test_support
