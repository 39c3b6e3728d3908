#include "common/pg/migrate.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "common/crypto.hpp"
#include "common/pg/url.hpp"

namespace idemsaga::common::pg {
namespace {

// Any fixed 64-bit number shared by every runner; "idemsaga" in ASCII.
constexpr long long kMigrationLock = 0x6964656d73616761LL;

constexpr const char* kLock = "SELECT pg_advisory_xact_lock($1)";

constexpr const char* kCreateLedger = R"sql(
  CREATE TABLE IF NOT EXISTS schema_migrations (
    set_name   text        NOT NULL,
    version    integer     NOT NULL,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (set_name, version)
  );
  COMMENT ON TABLE schema_migrations IS
    'Which embedded migrations (sql/<set>/V<nnn>__*.sql) this database has, and their checksums.';
)sql";

constexpr const char* kApplied = "SELECT set_name, version, checksum FROM schema_migrations";

constexpr const char* kRecord =
    "INSERT INTO schema_migrations (set_name, version, name, checksum) VALUES ($1, $2, $3, $4)";

constexpr const char* kDatabaseExists = "SELECT 1 FROM pg_database WHERE datname = $1";

}  // namespace

const std::vector<std::string>& DatabaseKinds() {
  static const std::vector<std::string> kinds = {"orchestrator", "inventory", "payment",
                                                 "shipping"};
  return kinds;
}

std::vector<std::string> SetsFor(std::string_view kind) {
  if (kind == "orchestrator") return {"orchestrator"};
  if (kind == "inventory") return {"guard", "inventory"};
  if (kind == "payment") return {"guard", "payment"};
  if (kind == "shipping") return {"guard", "shipping"};
  // A participant of a user's own: the guard's key table; the rest of its schema is theirs.
  if (kind == "guard") return {"guard"};
  // Where each tenant lives when tenants are spread over several clusters (common/placement).
  if (kind == "directory") return {"directory"};
  throw std::invalid_argument("unknown database kind '" + std::string(kind) +
                              "' (orchestrator, inventory, payment, shipping, guard, directory)");
}

int Migrate(pqxx::connection& conn, std::string_view kind) {
  auto sets = SetsFor(kind);
  pqxx::work tx(conn);
  tx.exec_params(kLock, kMigrationLock);
  tx.exec(kCreateLedger);
  std::map<std::pair<std::string, int>, std::string> applied;
  for (const auto& row : tx.exec(kApplied)) {
    applied[{row[0].as<std::string>(), row[1].as<int>()}] = row[2].as<std::string>();
  }
  int ran = 0;
  for (const auto& set : sets) {
    for (const auto& m : AllMigrations()) {
      if (m.set != set) continue;
      std::string checksum = Sha256Hex(m.sql);
      auto it = applied.find({m.set, m.version});
      if (it != applied.end()) {
        if (it->second != checksum) {
          throw std::runtime_error("migration " + m.set + "/V" + std::to_string(m.version) +
                                   " was edited after it was applied; add a new one instead");
        }
        continue;
      }
      tx.exec(m.sql);
      tx.exec_params(kRecord, m.set, m.version, m.name, checksum);
      ++ran;
    }
  }
  tx.commit();
  return ran;
}

void CreateDatabaseIfMissing(const std::string& server_url, const std::string& dbname) {
  pqxx::connection conn(WithSessionTimeouts(WithDatabase(server_url, "postgres")));
  pqxx::nontransaction tx(conn);
  if (!tx.exec_params(kDatabaseExists, dbname).empty()) return;
  // CREATE DATABASE takes no parameters; the name is quoted as an identifier.
  try {
    tx.exec("CREATE DATABASE " + tx.quote_name(dbname));
  } catch (const pqxx::sql_error& e) {
    if (e.sqlstate() != "42P04") throw;  // created concurrently by another runner
  }
}

}  // namespace idemsaga::common::pg
