// What the parent store's source files share (internal to orchestrator/store): the column list
// every read of a parent row selects, and how such a row is read back.
#pragma once

#include <chrono>
#include <pqxx/pqxx>

#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store::detail {

// Statements about one key find it by its primary key. They test the status with NOT IN (the
// status column allows four values) because a positive test would make the partial indexes
// (running sagas, the listing's) look usable: a generic plan once picked one and read every
// dead entry of every finished saga for each update of one row.
//
// Every query names the table `k`, so the column list also reads unambiguously in an
// UPDATE ... FROM (the batch takeover).
inline constexpr const char* kColumns = R"sql(
  k.tenant_id, k.idempotency_key, k.request_hash, k.request_body::text, k.saga_name,
  k.order_id, k.status, coalesce(k.lease_owner, ''), k.lease_epoch,
  coalesce(k.lease_expires_at > now(), false),
  coalesce(extract(epoch FROM k.lease_expires_at - now()), 0)::float8,
  k.steps::text, coalesce(k.failed_step, ''), coalesce(k.failure::text, 'null'), k.stuck,
  coalesce(k.response_status, 0), coalesce(k.response_headers::text, 'null'),
  coalesce(k.response_body, ''), k.trace_id, k.created_at::text, k.updated_at::text,
  coalesce(k.root_span_id, ''), extract(epoch FROM k.expires_at - now())::float8,
  k.saga_version, coalesce(k.cancel_requested::text, 'null'),
  coalesce(k.resolution::text, 'null'), coalesce(array_to_json(k.waiting_for)::text, 'null'))sql";

// The SagaRow of a row that selected kColumns from column `first` on.
SagaRow ToRow(const pqxx::row& row, int first = 0);

inline double Seconds(std::chrono::seconds s) { return static_cast<double>(s.count()); }

}  // namespace idemsaga::orchestrator::store::detail
