// Ready to shard by tenant: every SQL statement on a table keyed by tenant names its tenant
// (`tenant_id = $n`, or the tenant_id column of the row it inserts), so each one can be routed
// to the one shard that holds the tenant (docs/scaling.md). The few that must see every
// tenant are listed below with the reason; a new statement that filters by no tenant, or an
// exception that is no longer needed, fails this test.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

// Tables whose rows belong to a tenant (the distribution key of a sharded deployment). The
// demo inventory's stock is a catalogue shared by tenants (a reference table), and spans
// belong to a trace (distributed by trace_id): neither is here.
const std::regex kTenantTable(R"(\b(idempotency_keys|saga_step_replies|reservations|charges|shipments)\b)");
// `tenant_id = $n`, or an INSERT whose column list has tenant_id.
const std::regex kNamesTenant(
    R"(tenant_id\s*=\s*\$\d|INSERT\s+INTO\s+\w+(\s+AS\s+\w+)?\s*\([^)]*\btenant_id\b)");

// file: statement -> why it reads or writes across tenants (a multi-shard query on Citus).
const std::map<std::string, std::string> kAcrossTenants = {
    {"orchestrator/store/parent_listing.cpp: kCounts",
     "the running and stuck gauges of /metrics count every tenant's sagas"},
    {"orchestrator/store/parent_gc.cpp: kDeleteExpired",
     "garbage collection deletes expired keys of every tenant, in batches"},
    {"orchestrator/store/parent_store.cpp: kReleaseLeases",
     "shutdown releases every lease this process holds, whoever the tenant"},
    {"orchestrator/store/parent_store.cpp: kTakeOverBatch",
     "recovery takes over expired leases of any tenant (on Citus: run per shard)"},
    {"orchestrator/store/span_store.cpp: kDeleteForTraces",
     "garbage collection keeps a trace any tenant's key still names (a caller's shared trace)"},
    {"orchestrator/store/span_store.cpp: kDeleteUnowned",
     "garbage collection of spans whose saga is gone"},
    {"steps/guard/guard_sql.cpp: kDeleteExpired",
     "a participant's garbage collection deletes expired keys of every tenant"},
};

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SqlTenant, EveryStatementOnATenantsTableNamesItsTenant) {
  const std::filesystem::path root = IDEMSAGA_SOURCE_DIR;
  std::set<std::string> across;
  int statements = 0;
  // app: `idemsaga tenant move` (its copies and deletes are built per table, each with
  // `tenant_id = $1`).
  for (const char* dir : {"orchestrator", "steps", "demo", "examples", "app"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      if (entry.path().extension() != ".cpp") continue;
      std::string text = Read(entry.path());
      auto file = std::filesystem::relative(entry.path(), root).string();
      // `const common::pg::Statement kName{...};` (whatever builds its text), and the SQL
      // of a planned effect, `constexpr const char* kName = R"sql(...)sql";` (Guard::RunPlanned).
      static const std::regex statement(
          R"((?:Statement\s+(k\w+)\s*\{)|(?:const char\*\s+(k\w+)\s*=\s*R"sql\())");
      for (auto it = std::sregex_iterator(text.begin(), text.end(), statement);
           it != std::sregex_iterator(); ++it) {
        const bool planned = (*it)[2].matched;
        size_t start = it->position(0) + it->length(0);
        size_t end = text.find(planned ? ")sql\"" : "};", start);
        ASSERT_NE(end, std::string::npos) << file << ": " << it->str();
        std::string sql = text.substr(start, end - start);
        ++statements;
        if (!std::regex_search(sql, kTenantTable)) continue;
        if (!std::regex_search(sql, kNamesTenant)) {
          across.insert(file + ": " + (planned ? (*it)[2] : (*it)[1]).str());
        }
      }
    }
  }
  EXPECT_GT(statements, 40);
  std::set<std::string> listed;
  for (const auto& [name, why] : kAcrossTenants) listed.insert(name);
  EXPECT_EQ(across, listed) << "a statement on a tenant's table that names no tenant must say "
                               "why here (and in docs/scaling.md)";
}

}  // namespace
