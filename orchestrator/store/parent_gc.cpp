// ParentStore: garbage collection of finished keys past their retention, batched
// (parent_store.hpp). Their spans are SpanStore's to delete (span_store.hpp).

#include <set>

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;

// Batched so that a large backlog never holds long locks or a long transaction. The deleted
// keys' traces go to SpanStore::DeleteForTraces.
const common::pg::Statement kDeleteExpired{R"sql(
  DELETE FROM idempotency_keys
  WHERE ctid IN (SELECT ctid FROM idempotency_keys
                 WHERE status IN ('completed', 'failed') AND expires_at < now()
                 LIMIT $1)
  RETURNING trace_id)sql"};

}  // namespace

ExpiredKeys ParentStore::DeleteExpired(int batch) {
  auto rows =
      OneStatement([&](pqxx::nontransaction& tx) { return Exec(tx, kDeleteExpired, batch); });
  ExpiredKeys gone;
  gone.keys = static_cast<long long>(rows.size());
  std::set<std::string> traces;  // several keys may share a caller's trace
  for (const auto& r : rows) {
    if (!r[0].is_null()) traces.insert(r[0].as<std::string>());
  }
  gone.trace_ids.assign(traces.begin(), traces.end());
  return gone;
}

}  // namespace idemsaga::orchestrator::store
