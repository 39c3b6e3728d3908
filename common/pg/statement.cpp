#include "common/pg/statement.hpp"

#include <cstdint>
#include <cstdio>

namespace idemsaga::common::pg {
namespace {

// FNV-1a, 64 bits: a stable name for a text (std::hash may differ between builds of one
// program's libraries; a collision of two of our few dozen statements is not a concern).
std::string NameFor(const std::string& sql) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : sql) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char name[24];
  std::snprintf(name, sizeof name, "q%016llx", static_cast<unsigned long long>(h));
  return name;
}

}  // namespace

Statement::Statement(std::string sql) : sql_(std::move(sql)), name_(NameFor(sql_)) {}

void Define(pqxx::connection_base& conn, const Statement& s) {
  // prepare() with an existing name and the same text does nothing.
  conn.prepare(s.name(), s.sql());
}

}  // namespace idemsaga::common::pg
