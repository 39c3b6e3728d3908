// The one migration runner: used by `idemsaga migrate`, `idemsaga dev` and the tests.
//
// Migrations are the files sql/<set>/V<nnn>__<name>.sql, compiled into the binary. A database
// of a kind gets its sets in order: orchestrator = {orchestrator}; inventory = {guard,
// inventory}; payment = {guard, payment}; shipping = {guard, shipping} (the guard's key table
// is shared by participants); guard = {guard}, for a participant of your own; directory =
// {directory}, the tenant placement of a deployment on several clusters (common/pg/placement.hpp).
// All pending migrations apply in one transaction under pg_advisory_xact_lock, so concurrent
// runners serialise; an applied migration whose text changed is refused (append-only).
//   common::pg::Migrate(conn, "inventory");
#pragma once

#include <pqxx/pqxx>
#include <string>
#include <string_view>
#include <vector>

namespace idemsaga::common::pg {

struct Migration {
  std::string set;
  int version;
  std::string name;
  std::string sql;
};

// Every embedded migration, by set then version.
const std::vector<Migration>& AllMigrations();

// The product's database kinds: "orchestrator", "inventory", "payment", "shipping" (SetsFor
// also knows "guard", which no product database is).
const std::vector<std::string>& DatabaseKinds();

// The migration sets of a database kind; throws std::invalid_argument for an unknown kind.
std::vector<std::string> SetsFor(std::string_view kind);

// Applies what is pending; returns how many migrations ran.
int Migrate(pqxx::connection& conn, std::string_view kind);

// CREATE DATABASE `dbname` on the server of `server_url` unless it exists.
void CreateDatabaseIfMissing(const std::string& server_url, const std::string& dbname);

}  // namespace idemsaga::common::pg
