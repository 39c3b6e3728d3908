// ParentStore: garbage collection of finished keys past their retention, with their spans, and
// of spans no key owns; batched (parent_store.hpp).

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_rows.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;
using detail::Seconds;

// Batched so that a large backlog never holds long locks or a long transaction. A key's
// spans go with it.
const common::pg::Statement kDeleteExpired{R"sql(
  WITH gone AS (
    DELETE FROM idempotency_keys
    WHERE ctid IN (SELECT ctid FROM idempotency_keys
                   WHERE status IN ('completed', 'failed') AND expires_at < now()
                   LIMIT $1)
    RETURNING tenant_id, idempotency_key, trace_id)
  , spans_gone AS (
    DELETE FROM trace_spans s WHERE s.trace_id IN (SELECT trace_id FROM gone)
      -- A caller may have sent one traceparent for several orders: keep a trace in use.
      AND NOT EXISTS (SELECT 1 FROM idempotency_keys k
                      WHERE k.trace_id = s.trace_id
                        AND (k.tenant_id, k.idempotency_key) NOT IN
                            (SELECT tenant_id, idempotency_key FROM gone)))
  SELECT count(*) FROM gone)sql"};

const common::pg::Statement kDeleteUnownedSpans{R"sql(
  DELETE FROM trace_spans WHERE ctid IN (
    SELECT s.ctid FROM trace_spans s
    WHERE s.received_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.trace_id = s.trace_id)
    LIMIT $2))sql"};

}  // namespace

long long ParentStore::DeleteExpired(int batch) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto n = ExecOne(tx, kDeleteExpired, batch)[0].as<long long>();
    return n;
  });
}

long long ParentStore::DeleteUnownedSpans(int batch) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto r =
        Exec(tx, kDeleteUnownedSpans,
             Seconds(std::chrono::duration_cast<std::chrono::seconds>(options_.retention)), batch);
    return static_cast<long long>(r.affected_rows());
  });
}

}  // namespace idemsaga::orchestrator::store
