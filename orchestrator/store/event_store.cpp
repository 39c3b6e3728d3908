#include "orchestrator/store/event_store.hpp"

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;

// Only into a run still running its actions (a compensating or finished run takes no event)
// whose wait for it ($9: that wait's events) has not taken one already.
const common::pg::Statement kInsert{R"sql(
  INSERT INTO saga_events (tenant_id, idempotency_key, name, event_key, request_hash, payload,
                           response_status, response_body)
  SELECT $1, $2, $3, $4, $5, $6::jsonb, $7, $8
  FROM idempotency_keys
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'started'
    AND NOT EXISTS (SELECT 1 FROM saga_events t
                    WHERE t.tenant_id = $1 AND t.idempotency_key = $2
                      AND t.name = ANY($9::text[]) AND t.taken_at IS NOT NULL)
  ON CONFLICT (tenant_id, idempotency_key, name) DO NOTHING
  RETURNING 1)sql"};

const common::pg::Statement kGet{R"sql(
  SELECT event_key, request_hash, response_status, response_body
  FROM saga_events WHERE tenant_id = $1 AND idempotency_key = $2 AND name = $3)sql"};

// Only a run parked on this event: one that some replica runs keeps its lease (it reads
// the event itself at its next look).
const common::pg::Statement kWake{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now(), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status NOT IN ('completed', 'failed')
    AND $3 = ANY(waiting_for))sql"};

// The event the wait took before, else the first delivered, marked taken: an owner that
// resumes the run after a crash decides as the one before it did.
const common::pg::Statement kTake{R"sql(
  WITH chosen AS (
    SELECT name FROM saga_events
    WHERE tenant_id = $1 AND idempotency_key = $2 AND name = ANY($3::text[])
    ORDER BY taken_at IS NULL, received_at, name LIMIT 1
    FOR UPDATE)
  UPDATE saga_events e SET taken_at = coalesce(e.taken_at, now())
  FROM chosen
  WHERE e.tenant_id = $1 AND e.idempotency_key = $2 AND e.name = chosen.name
  RETURNING e.name, e.payload::text)sql"};

}  // namespace

Delivered EventStore::Deliver(const EventDelivery& d, bool accepting) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    bool inserted = accepting && !Exec(tx, kInsert, d.tenant_id, d.run_key, d.name, d.event_key,
                                       d.request_hash, d.payload.dump(), d.response_status,
                                       d.response_body, TextArray(d.wait_events))
                                      .empty();
    Delivered out;
    if (inserted) {
      out = {Delivered::kStored, d.response_status, d.response_body};
    } else {
      auto stored = Exec(tx, kGet, d.tenant_id, d.run_key, d.name);
      if (stored.empty()) return Delivered{Delivered::kNotAccepted};
      const auto& row = stored[0];
      if (row[0].as<std::string>() != d.event_key) return Delivered{Delivered::kAlreadyReceived};
      if (row[1].as<std::string>() != d.request_hash) return Delivered{Delivered::kKeyReused};
      out = {Delivered::kReplayed, row[2].as<int>(), row[3].as<std::string>()};
    }
    // After the insert has committed (autocommit); a retry wakes it again, harmlessly: a
    // delivery whose wake-up was lost to a crash is still read at the run's next look.
    Exec(tx, kWake, d.tenant_id, d.run_key, d.name);
    return out;
  });
}

std::optional<steps::saga::ReceivedEvent> EventStore::Take(const std::string& tenant_id,
                                                           const std::string& run_key,
                                                           const std::vector<std::string>& names) {
  return pool_.With([&](pqxx::connection& conn) -> std::optional<steps::saga::ReceivedEvent> {
    pqxx::nontransaction tx(conn);
    auto r = Exec(tx, kTake, tenant_id, run_key, TextArray(names));
    if (r.empty()) return std::nullopt;
    return steps::saga::ReceivedEvent{r[0][0].as<std::string>(),
                                      nlohmann::json::parse(r[0][1].as<std::string>())};
  });
}

}  // namespace idemsaga::orchestrator::store
