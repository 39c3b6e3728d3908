#include "app/tenant_move.hpp"

#include <algorithm>
#include <map>
#include <pqxx/pqxx>
#include <set>
#include <stdexcept>
#include <thread>

#include "common/pg/url.hpp"
#include "common/placement.hpp"

namespace idemsaga::app {
namespace {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// The placement row's conditional updates: each takes the row from one state of this move to
// the next, so a second mover, or a move of the same tenant elsewhere, changes nothing.
constexpr const char* kBeginMove = R"sql(
  UPDATE tenant_placement SET state = 'draining', moving_to = $2, updated_at = now()
  WHERE tenant_id = $1 AND state = 'active' AND cluster <> $2)sql";
constexpr const char* kFreeze = R"sql(
  UPDATE tenant_placement SET state = 'frozen', updated_at = now()
  WHERE tenant_id = $1 AND state = 'draining' AND moving_to = $2)sql";
constexpr const char* kThaw = R"sql(
  UPDATE tenant_placement SET state = 'draining', updated_at = now()
  WHERE tenant_id = $1 AND state = 'frozen' AND moving_to = $2)sql";
constexpr const char* kCallOff = R"sql(
  UPDATE tenant_placement SET state = 'active', moving_to = NULL, updated_at = now()
  WHERE tenant_id = $1 AND moving_to = $2)sql";
constexpr const char* kSwitch = R"sql(
  UPDATE tenant_placement SET cluster = moving_to, state = 'active', moving_to = NULL,
                              updated_at = now()
  WHERE tenant_id = $1 AND state = 'frozen' AND moving_to = $2)sql";
constexpr const char* kWhere = R"sql(
  SELECT cluster, state, coalesce(moving_to, '') FROM tenant_placement WHERE tenant_id = $1)sql";

// What still runs: a saga (started, compensating) in the orchestrator's key table, an external
// step call under way (pending) in a participant's.
constexpr const char* kRunning = R"sql(
  SELECT count(*) FROM idempotency_keys
  WHERE tenant_id = $1 AND status IN ('started', 'compensating', 'pending'))sql";

// The tables that hold a tenant's rows: every table of the schema with a tenant_id column
// (keys, sagas, events, effects: a participant of a team's own included), and who refers to
// whom, so that a referenced row is copied first and deleted last.
constexpr const char* kTenantTables = R"sql(
  SELECT c.relname FROM pg_class c
  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
  WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
  ORDER BY c.relname)sql";
constexpr const char* kReferences = R"sql(
  SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
  WHERE contype = 'f' AND connamespace = 'public'::regnamespace)sql";

// The tenant's credentials: copied, and also kept in the source so that a client that still
// calls there is told where the tenant went (503 naming it) instead of 401.
constexpr const char* kCredentialsTable = "tenants";
// Rows per batch of a copy or a delete.
constexpr int kBatch = 500;

// libpq sessions whose timestamps print in UTC (the copy is compared by the text of its rows)
// and whose statements may run long (a batch of a large tenant).
std::string SessionUrl(const std::string& url) {
  return common::pg::WithParam(
      common::pg::WithSessionTimeouts(url, {.statement_timeout_ms = 120000}), "options",
      "-c TimeZone=UTC");
}

// The tenant's tables of one database, a referenced table before those that refer to it.
std::vector<std::string> TenantTables(pqxx::connection& conn) {
  pqxx::read_transaction tx(conn);
  std::vector<std::string> tables;
  for (const auto& row : tx.exec(kTenantTables)) tables.push_back(row[0].as<std::string>());
  std::multimap<std::string, std::string> refers;  // table -> a table it refers to
  for (const auto& row : tx.exec(kReferences)) {
    if (row[0].as<std::string>() != row[1].as<std::string>()) {
      refers.emplace(row[0].as<std::string>(), row[1].as<std::string>());
    }
  }
  std::vector<std::string> ordered;
  std::set<std::string> placed, all(tables.begin(), tables.end());
  while (ordered.size() < tables.size()) {
    size_t before = ordered.size();
    for (const auto& t : tables) {
      if (placed.count(t) != 0) continue;
      auto [from, to] = refers.equal_range(t);
      bool ready = std::all_of(from, to, [&](const auto& r) {
        return all.count(r.second) == 0 || placed.count(r.second) != 0;
      });
      if (ready) {
        ordered.push_back(t);
        placed.insert(t);
      }
    }
    if (ordered.size() == before) throw std::runtime_error("tables refer to each other in a cycle");
  }
  return ordered;
}

// Copies the rows `where` selects from `table` (aliased t; $1 is the tenant) in batches, by
// physical position: nothing of the tenant is written while it is frozen.
long long CopyRows(pqxx::connection& source, pqxx::connection& target, const std::string& table,
                   const std::string& where, const std::string& tenant) {
  long long copied = 0;
  std::string after = "(0,0)";
  for (;;) {
    std::string rows;
    int n = 0;
    {
      pqxx::read_transaction tx(source);
      auto t = tx.quote_name(table);
      auto batch = tx.exec_params(
          "SELECT t.ctid::text, row_to_json(t)::text FROM " + t + " t WHERE (" + where +
              ") AND t.ctid > $2::tid ORDER BY t.ctid LIMIT " + std::to_string(kBatch),
          tenant, after);
      for (const auto& row : batch) {
        rows += (n++ == 0 ? "[" : ",") + row[1].as<std::string>();
        after = row[0].as<std::string>();
      }
    }
    if (n == 0) return copied;
    rows += "]";
    pqxx::work tx(target);
    auto t = tx.quote_name(table);
    tx.exec_params(
        "INSERT INTO " + t + " SELECT * FROM json_populate_recordset(NULL::" + t + ", $1::json)",
        rows);
    tx.commit();
    copied += n;
  }
}

// The tenant's rows of `table`: how many, and a checksum of their text.
std::pair<long long, std::string> Fingerprint(pqxx::connection& conn, const std::string& table,
                                              const std::string& tenant) {
  pqxx::read_transaction tx(conn);
  auto row = tx.exec_params1(
      "SELECT count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::text "
      "FROM " +
          tx.quote_name(table) + " t WHERE t.tenant_id = $1",
      tenant);
  return {row[0].as<long long>(), row[1].as<std::string>()};
}

long long DeleteRows(pqxx::connection& conn, const std::string& table, const std::string& tenant) {
  long long deleted = 0;
  for (;;) {
    pqxx::work tx(conn);
    auto t = tx.quote_name(table);
    auto r = tx.exec_params("DELETE FROM " + t + " WHERE ctid = ANY (ARRAY(SELECT ctid FROM " + t +
                                " WHERE tenant_id = $1 LIMIT " + std::to_string(kBatch) + "))",
                            tenant);
    tx.commit();
    deleted += r.affected_rows();
    if (r.affected_rows() == 0) return deleted;
  }
}

bool HasTable(pqxx::connection& conn, const std::string& table) {
  pqxx::read_transaction tx(conn);
  return !tx.exec_params1("SELECT to_regclass($1) IS NULL", "public." + table)[0].as<bool>();
}

}  // namespace

void TenantMove::Say(const std::string& line) const {
  if (options_.progress) options_.progress(line);
}

std::tuple<std::string, std::string, std::string> TenantMove::Where() const {
  pqxx::connection conn(SessionUrl(options_.directory_url));
  pqxx::read_transaction tx(conn);
  auto rows = tx.exec_params(kWhere, options_.tenant);
  if (rows.empty()) throw std::runtime_error("tenant " + options_.tenant + " is placed nowhere");
  return {rows[0][0].as<std::string>(), rows[0][1].as<std::string>(), rows[0][2].as<std::string>()};
}

bool TenantMove::Update(const char* sql) const {
  pqxx::connection conn(SessionUrl(options_.directory_url));
  pqxx::work tx(conn);
  auto r = tx.exec_params(sql, options_.tenant, options_.to);
  tx.commit();
  return r.affected_rows() == 1;
}

long long TenantMove::Running() const {
  long long running = 0;
  for (const auto& [from, to] : options_.databases) {
    pqxx::connection conn(SessionUrl(from));
    if (!HasTable(conn, "idempotency_keys")) continue;
    pqxx::read_transaction tx(conn);
    running += tx.exec_params1(kRunning, options_.tenant)[0].as<long long>();
  }
  return running;
}

bool TenantMove::Drain() {
  auto deadline = Clock::now() + options_.drain_timeout;
  for (;;) {
    long long running = Running();
    if (running == 0) return true;
    if (Clock::now() >= deadline) {
      Say("still running after the drain timeout: " + std::to_string(running));
      return false;
    }
    std::this_thread::sleep_for(Ms(200));
  }
}

TenantMoveReport TenantMove::Run() {
  const auto& tenant = options_.tenant;
  if (!common::IsValidClusterName(options_.to)) {
    throw std::runtime_error("--to must be a cluster's name (1-64 of [a-z0-9_-])");
  }
  if (options_.databases.empty()) throw std::runtime_error("no databases to move");
  TenantMoveReport report;
  auto [cluster, state, moving_to] = Where();
  report.from = cluster;
  if (state == "active" && cluster == options_.to) {
    throw std::runtime_error("tenant " + tenant + " is on " + cluster + " already");
  }
  if (state != "active" && moving_to != options_.to) {
    throw std::runtime_error("tenant " + tenant + " is being moved to " + moving_to);
  }
  auto settle = [&](const std::string& why) {
    Say("waiting " + std::to_string(common::kPlacementSettle.count()) + " ms: " + why);
    std::this_thread::sleep_for(common::kPlacementSettle);
  };
  auto call_off = [&](const std::string& why) {
    Update(kCallOff);
    throw std::runtime_error("move of " + tenant + " called off, " + why + "; it is served on " +
                             cluster + " again");
  };
  auto began = Clock::now();
  if (state == "active") {
    if (!Update(kBeginMove)) throw std::runtime_error("the placement of " + tenant + " changed");
    Say("draining " + tenant + " on " + cluster + " (moving to " + options_.to + ")");
    state = "draining";
  }
  // A request admitted just before the services saw the drain may claim its key a little
  // later: once frozen, look again, and drain again if something started.
  for (;;) {
    if (state == "draining") {
      settle("every service sees the drain");
      if (!Drain()) call_off("its sagas did not finish within the drain timeout");
      report.drained = std::chrono::duration_cast<Ms>(Clock::now() - began);
      if (!Update(kFreeze)) throw std::runtime_error("the placement of " + tenant + " changed");
      Say("frozen " + tenant + " after " + std::to_string(report.drained.count()) + " ms");
      state = "frozen";
      settle("every service sees the freeze");
    }
    if (Running() == 0) break;
    if (!Update(kThaw)) throw std::runtime_error("the placement of " + tenant + " changed");
    Say("a saga of " + tenant + " started late: draining again");
    state = "draining";
  }
  auto frozen_at = Clock::now();
  for (const auto& [from_url, to_url] : options_.databases) {
    pqxx::connection source(SessionUrl(from_url)), target(SessionUrl(to_url));
    const auto tables = TenantTables(source);
    // What the target holds of the tenant is left over (it serves the tenant only after the
    // switch below): an earlier stay there, or a move called off half-way.
    for (auto t = tables.rbegin(); t != tables.rend(); ++t) DeleteRows(target, *t, tenant);
    for (const auto& table : tables) {
      long long n = CopyRows(source, target, table, "t.tenant_id = $1", tenant);
      report.rows_copied += n;
      if (Fingerprint(source, table, tenant) != Fingerprint(target, table, tenant)) {
        call_off("the copy of " + table + " in " + common::pg::DatabaseOf(to_url) +
                 " differs from its source");
      }
      Say("copied " + std::to_string(n) + " rows of " + table + " to " +
          common::pg::DatabaseOf(to_url));
    }
    // The orchestrator's spans belong to traces, not tenants: those of the tenant's sagas.
    if (HasTable(source, "trace_spans") && HasTable(source, "idempotency_keys")) {
      report.rows_copied += CopyRows(
          source, target, "trace_spans",
          "t.trace_id IN (SELECT trace_id FROM idempotency_keys WHERE tenant_id = $1)", tenant);
    }
  }
  if (!Update(kSwitch)) throw std::runtime_error("the placement of " + tenant + " changed");
  report.frozen = std::chrono::duration_cast<Ms>(Clock::now() - frozen_at);
  Say("switched " + tenant + " to " + options_.to + " after " +
      std::to_string(report.frozen.count()) + " ms frozen");
  // The source serves none of it any more (its copy of the placement says so, or it refuses
  // everyone); what is left there is deleted, the referring rows first.
  for (const auto& [from_url, to_url] : options_.databases) {
    pqxx::connection source(SessionUrl(from_url));
    auto tables = TenantTables(source);
    std::reverse(tables.begin(), tables.end());
    for (const auto& table : tables) {
      if (table != kCredentialsTable) report.rows_deleted += DeleteRows(source, table, tenant);
    }
  }
  Say("deleted " + std::to_string(report.rows_deleted) + " rows of " + tenant + " from " + cluster);
  return report;
}

}  // namespace idemsaga::app
