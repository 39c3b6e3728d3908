// Prepared statements: every hot statement is parsed and planned once per connection, not once
// per call (pgbench on our insert + update: +47% TPS prepared).
//
// A Statement names itself after its SQL, so one text is one name on every connection, however
// many modules use it. Exec() defines it on the transaction's connection the first time that
// connection sees it; libpqxx 6.4 then prepares it on the server at its first execution, and
// again after a silent reconnect (tests/pg/statement_pgtest.cpp). Connections the pool opens
// anew start empty and prepare again. Parameters as for exec_params.
//   const common::pg::Statement kGet{"SELECT ... WHERE id = $1"};
//   auto rows = common::pg::Exec(tx, kGet, id);
#pragma once

#include <pqxx/pqxx>
#include <string>
#include <utility>

namespace idemsaga::common::pg {

class Statement {
 public:
  explicit Statement(std::string sql);
  const std::string& name() const { return name_; }
  const std::string& sql() const { return sql_; }

 private:
  std::string sql_;
  std::string name_;
};

// Defines `s` on `conn` unless it already is (a map lookup).
void Define(pqxx::connection_base& conn, const Statement& s);

template <typename... Args>
pqxx::result Exec(pqxx::transaction_base& tx, const Statement& s, Args&&... args) {
  Define(tx.conn(), s);
  return tx.exec_prepared(s.name(), std::forward<Args>(args)...);
}

// Exec that expects exactly one row (pqxx::unexpected_rows otherwise), as exec_params1.
template <typename... Args>
pqxx::row ExecOne(pqxx::transaction_base& tx, const Statement& s, Args&&... args) {
  auto r = Exec(tx, s, std::forward<Args>(args)...);
  if (r.size() != 1) {
    throw pqxx::unexpected_rows("expected 1 row from " + s.name() + ", got " +
                                std::to_string(r.size()));
  }
  return r[0];
}

}  // namespace idemsaga::common::pg
