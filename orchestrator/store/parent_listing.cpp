// ParentStore: what the API and operators read and ask of sagas (listing, the sagas created
// lately, the running counts, retry-now, cancel and resolve); parent_store.hpp is the contract.

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_rows.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;
using common::pg::ExecOne;
using detail::kColumns;
using detail::Seconds;
using detail::ToRow;

// The first request is kept: who asked first, and why. A parked saga wakes now to act on it
// (one that runs hears of it at its next lease renewal).
const common::pg::Statement kRequestCancel{R"sql(
  UPDATE idempotency_keys
  SET cancel_requested = coalesce(cancel_requested, $3::jsonb || jsonb_build_object('at', now())),
      lease_expires_at = CASE WHEN waiting_for IS NULL THEN lease_expires_at ELSE now() END,
      updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'started'
  RETURNING 1)sql"};

// Only a stuck compensation: its runner has deferred it, so nobody is undoing it right now
// (a takeover clears `stuck` first, and this then changes nothing). Its lease expires now, so
// recovery goes on with the rest at once.
const common::pg::Statement kResolve{R"sql(
  UPDATE idempotency_keys
  SET stuck = false, resolution = $3::jsonb || jsonb_build_object('at', now()),
      steps = $4::jsonb, lease_expires_at = now(), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'compensating' AND stuck
  RETURNING 1)sql"};

// Only a deferred lease (stuck is cleared by every takeover): a saga some replica is running
// right now keeps its lease.
const common::pg::Statement kRetryNow{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now(), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status NOT IN ('completed', 'failed')
    AND stuck)sql"};

// A branch per listing index (V004): each reads its index newest first and stops at the limit;
// a branch the status filter rules out is skipped before it reads anything, and so is the
// finished branch of a stuck-only listing (finishing clears `stuck`). A saga-name filter has
// no index of its own: it reads on until `limit` rows match (for a rarely run saga, the
// tenant's retained keys; an index on every key insert would cost each order more).
const common::pg::Statement kList{std::string("SELECT ") + kColumns + R"sql(
  FROM ((SELECT * FROM idempotency_keys
         WHERE tenant_id = $1 AND status IN ('started', 'compensating')
           AND $2 IN ('', 'started', 'compensating') AND ($2 = '' OR status = $2)
           AND (NOT $3 OR stuck) AND ($5 = '' OR saga_name = $5)
         ORDER BY created_at DESC LIMIT $4)
        UNION ALL
        (SELECT * FROM idempotency_keys
         WHERE tenant_id = $1 AND status IN ('completed', 'failed')
           AND $2 IN ('', 'completed', 'failed') AND ($2 = '' OR status = $2)
           AND NOT $3 AND ($5 = '' OR saga_name = $5)
         ORDER BY created_at DESC LIMIT $4)) k
  ORDER BY k.created_at DESC
  LIMIT $4)sql"};

const common::pg::Statement kCounts{R"sql(
  SELECT count(*), count(*) FILTER (WHERE stuck) FROM idempotency_keys
  WHERE status IN ('started', 'compensating'))sql"};

// A tenant's sagas created in the last $2 seconds, in key order after $3: the primary key's
// range, filtered by age.
const common::pg::Statement kCreatedSince{std::string("SELECT ") + kColumns + R"sql(
  FROM idempotency_keys k
  WHERE tenant_id = $1 AND idempotency_key > $3
    AND created_at > now() - make_interval(secs => $2)
  ORDER BY idempotency_key LIMIT $4)sql"};

}  // namespace

bool ParentStore::RetryNow(const std::string& tenant_id, const std::string& key) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kRetryNow, tenant_id, key);
    return r.affected_rows() == 1;
  });
}

bool ParentStore::RequestCancel(const std::string& tenant_id, const std::string& key,
                                const nlohmann::json& request) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    return Exec(tx, kRequestCancel, tenant_id, key, request.dump()).affected_rows() == 1;
  });
}

bool ParentStore::Resolve(const std::string& tenant_id, const std::string& key,
                          const nlohmann::json& resolution, const nlohmann::json& steps) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    return Exec(tx, kResolve, tenant_id, key, resolution.dump(), steps.dump()).affected_rows() == 1;
  });
}

std::vector<SagaRow> ParentStore::CreatedSince(const std::string& tenant_id,
                                               std::chrono::seconds since, const std::string& after,
                                               int limit) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    std::vector<SagaRow> out;
    for (const auto& r : Exec(tx, kCreatedSince, tenant_id, Seconds(since), after, limit)) {
      out.push_back(ToRow(r));
    }
    return out;
  });
}

std::vector<SagaRow> ParentStore::List(const std::string& tenant_id,
                                       std::optional<SagaStatus> status, bool stuck_only, int limit,
                                       const std::string& saga) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    std::vector<SagaRow> out;
    for (const auto& r : Exec(tx, kList, tenant_id, std::string(status ? ToString(*status) : ""),
                              stuck_only, limit, saga)) {
      out.push_back(ToRow(r));
    }
    return out;
  });
}

ParentStore::Counts ParentStore::CountRunning() {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kCounts)[0];
    return Counts{r[0].as<long long>(), r[1].as<long long>()};
  });
}

}  // namespace idemsaga::orchestrator::store
