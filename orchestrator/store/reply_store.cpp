#include "orchestrator/store/reply_store.hpp"

#include "common/crypto.hpp"
#include "common/pg/statement.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;

// A command published again keeps the reply it may have: a redelivered command is answered
// by the participant's replay, byte for byte the same.
const common::pg::Statement kPublished{R"sql(
  INSERT INTO saga_step_replies (tenant_id, idempotency_key, derived_key, correlation)
  VALUES ($1, $2, $3, $4)
  ON CONFLICT (tenant_id, correlation)
  DO UPDATE SET publishes = saga_step_replies.publishes + 1, published_at = now())sql"};

const common::pg::Statement kFind{R"sql(
  SELECT reply_status, coalesce(reply_retry_after, ''), coalesce(reply_body, ''), replies,
         publishes
  FROM saga_step_replies
  WHERE tenant_id = $1 AND correlation = $2 AND reply_status IS NOT NULL)sql"};

const common::pg::Statement kForget{R"sql(
  UPDATE saga_step_replies
  SET reply_status = NULL, reply_retry_after = NULL, reply_body = NULL, replied_at = NULL
  WHERE tenant_id = $1 AND correlation = $2)sql"};

// The first reply wins; every reply is counted (duplicates are what the fault suite shows).
const common::pg::Statement kAnswer{R"sql(
  UPDATE saga_step_replies r
  SET reply_status = coalesce(r.reply_status, $3),
      reply_retry_after = CASE WHEN r.reply_status IS NULL THEN $4 ELSE r.reply_retry_after END,
      reply_body = CASE WHEN r.reply_status IS NULL THEN $5 ELSE r.reply_body END,
      replied_at = coalesce(r.replied_at, now()),
      replies = r.replies + 1
  FROM (SELECT reply_status AS before FROM saga_step_replies
        WHERE tenant_id = $1 AND correlation = $2 FOR UPDATE) old
  WHERE r.tenant_id = $1 AND r.correlation = $2
  RETURNING r.idempotency_key, old.before IS NULL)sql"};

// Only a run parked (waiting_for is set by every park, cleared by every takeover): one that a
// thread runs keeps its lease, and reads the reply at its next look. A stuck one keeps its
// slower pace.
const common::pg::Statement kWake{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now(), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status IN ('started', 'compensating')
    AND waiting_for IS NOT NULL AND NOT stuck
  RETURNING 1)sql"};

const common::pg::Statement kRunning{R"sql(
  SELECT 1 FROM idempotency_keys
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status IN ('started', 'compensating')
    AND waiting_for IS NULL)sql"};

}  // namespace

std::string ReplyStore::Correlation(const std::string& derived_key) {
  return common::Sha256Hex(derived_key);
}

void ReplyStore::Published(const std::string& tenant_id, const std::string& run_key,
                           const std::string& derived_key) {
  pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    Exec(tx, kPublished, tenant_id, run_key, derived_key, Correlation(derived_key));
  });
}

std::optional<StepReply> ReplyStore::Find(const std::string& tenant_id,
                                          const std::string& derived_key) {
  return pool_.With([&](pqxx::connection& conn) -> std::optional<StepReply> {
    pqxx::nontransaction tx(conn);
    auto r = Exec(tx, kFind, tenant_id, Correlation(derived_key));
    if (r.empty()) return std::nullopt;
    return StepReply{r[0][0].as<int>(), r[0][1].as<std::string>(), r[0][2].as<std::string>(),
                     r[0][3].as<int>(), r[0][4].as<int>()};
  });
}

void ReplyStore::Forget(const std::string& tenant_id, const std::string& derived_key) {
  pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    Exec(tx, kForget, tenant_id, Correlation(derived_key));
  });
}

ReplyStore::Answered ReplyStore::Answer(const std::string& tenant_id,
                                        const std::string& correlation, int status,
                                        const std::string& retry_after, const std::string& body,
                                        std::string& run_key) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    auto r = Exec(tx, kAnswer, tenant_id, correlation, status, retry_after, body);
    if (r.empty()) return Answered::kUnknown;
    run_key = r[0][0].as<std::string>();
    return r[0][1].as<bool>() ? Answered::kStored : Answered::kDuplicate;
  });
}

ReplyStore::Woken ReplyStore::Wake(const std::string& tenant_id, const std::string& run_key) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    if (!Exec(tx, kWake, tenant_id, run_key).empty()) return Woken::kWoken;
    return Exec(tx, kRunning, tenant_id, run_key).empty() ? Woken::kNot : Woken::kRunning;
  });
}

}  // namespace idemsaga::orchestrator::store
