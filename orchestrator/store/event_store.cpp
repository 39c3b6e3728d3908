#include "orchestrator/store/event_store.hpp"

#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace orchestrator {
namespace {

using common::pg::Exec;

// Only into a run still running its actions: a compensating or finished run takes no event.
const common::pg::Statement kInsert{R"sql(
  INSERT INTO saga_events (tenant_id, idempotency_key, name, event_key, request_hash, payload,
                           response_status, response_body)
  SELECT $1, $2, $3, $4, $5, $6::jsonb, $7, $8
  FROM idempotency_keys
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'started'
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

const common::pg::Statement kFirst{R"sql(
  SELECT name, payload::text FROM saga_events
  WHERE tenant_id = $1 AND idempotency_key = $2 AND name = ANY($3::text[])
  ORDER BY received_at, name LIMIT 1)sql"};

}  // namespace

Delivered EventStore::Deliver(const EventDelivery& d, bool accepting) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    bool inserted =
        accepting && !Exec(tx, kInsert, d.tenant_id, d.run_key, d.name, d.event_key, d.request_hash,
                           d.payload.dump(), d.response_status, d.response_body)
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

std::optional<saga::ReceivedEvent> EventStore::First(const std::string& tenant_id,
                                                     const std::string& run_key,
                                                     const std::vector<std::string>& names) {
  return pool_.With([&](pqxx::connection& conn) -> std::optional<saga::ReceivedEvent> {
    pqxx::nontransaction tx(conn);
    auto r = Exec(tx, kFirst, tenant_id, run_key, TextArray(names));
    if (r.empty()) return std::nullopt;
    return saga::ReceivedEvent{r[0][0].as<std::string>(),
                               nlohmann::json::parse(r[0][1].as<std::string>())};
  });
}

}  // namespace orchestrator
