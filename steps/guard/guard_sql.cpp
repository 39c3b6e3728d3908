// Every statement the guard runs on idempotency_keys (steps/guard/guard_internal.hpp).
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard::detail {

// Blocks on the unique index while a concurrent duplicate is uncommitted (bounded by the
// session's lock_timeout); returns a row only to the request that now owns the key.
const common::pg::Statement kClaim{R"sql(
  INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, status, expires_at)
  VALUES ($1, $2, $3, 'started', now() + make_interval(secs => $4))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

// Duplicates::kFailFast: one lock per (tenant, key) for this transaction, or false at once.
// A 64-bit hash: two keys that collide only make one of them wait for a retry.
const common::pg::Statement kTryKeyLock{R"sql(
  SELECT pg_try_advisory_xact_lock(hashtextextended($1 || E'\n' || $2, 0)))sql"};

std::string InsertAnsweredSql(size_t after, const char* when) {
  auto p = [after](size_t i) { return "$" + std::to_string(after + i); };
  std::string values = p(1) + ", " + p(2) + ", " + p(3) + ", 'completed', " + p(4) + ", " + p(5) +
                       ", " + p(6) + ", now() + make_interval(secs => " + p(7) + "), " + p(8) +
                       "::jsonb";
  return "INSERT INTO idempotency_keys\n"
         "    (tenant_id, idempotency_key, request_hash, status, response_status,\n"
         "     response_content_type, response_body, expires_at, response_headers)\n" +
         (when == nullptr
              ? "  VALUES (" + values + ")\n  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
              : "  SELECT " + values + " WHERE " + when) +
         "\n  RETURNING 1";
}
const common::pg::Statement kInsertAnswered{InsertAnsweredSql(0)};

const common::pg::Statement kLoad{R"sql(
  SELECT status, request_hash, response_status, response_content_type, response_body,
         compensated_at IS NOT NULL, response_headers::text
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

// RunExternal's claim: pending, under a lease and the first fencing token.
const common::pg::Statement kClaimPending{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, lease_expires_at, fencing_token,
     expires_at)
  VALUES ($1, $2, $3, 'pending', now() + make_interval(secs => $4), 1,
          now() + make_interval(secs => $5))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING fencing_token)sql"};

// A pending claim whose holder's lease ran out, taken over under the next token.
const common::pg::Statement kTakeOverPending{R"sql(
  UPDATE idempotency_keys
  SET lease_expires_at = now() + make_interval(secs => $4), fencing_token = fencing_token + 1
  WHERE tenant_id = $1 AND idempotency_key = $2 AND request_hash = $3 AND status = 'pending'
    AND lease_expires_at <= now()
  RETURNING fencing_token)sql"};

// The external call's answer, stored only by the holder of the current token.
const common::pg::Statement kRecordExternal{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = $4, response_content_type = $5, response_body = $6,
      response_headers = $7::jsonb, lease_expires_at = NULL
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending' AND fencing_token = $3)sql"};

// Ends the lease now: the next request takes the claim over at once.
const common::pg::Statement kReleaseLease{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending' AND fencing_token = $3)sql"};

const common::pg::Statement kStore{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = $3, response_content_type = $4, response_body = $5,
      response_headers = $6::jsonb
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kTombstone{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, response_status, response_content_type,
     response_body, expires_at)
  VALUES ($1, $2, NULL, 'tombstone', 409, 'application/problem+json', $3,
          now() + make_interval(secs => $4))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

// A key still in use (a stuck saga re-drives its steps, or retries a compensation, for as long
// as it takes) is kept a full retention from now. Only keys past half their retention are
// written, so ordinary replays stay read-only. It runs before the key is read: its row lock
// makes a concurrent garbage collection skip the key, where a read first could answer from a
// row that GC deletes a moment later.
const common::pg::Statement kKeepAlive{R"sql(
  UPDATE idempotency_keys SET expires_at = now() + make_interval(secs => $3)
  WHERE tenant_id = $1 AND idempotency_key = $2
    AND expires_at < now() + make_interval(secs => $3 / 2))sql"};

const common::pg::Statement kLockAction{R"sql(
  SELECT status, response_status, response_body, compensated_at IS NOT NULL,
         coalesce(lease_expires_at <= now(), false)
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2
  FOR UPDATE)sql"};

// An external action whose holder's lease ran out, ended by its compensation: from now on it
// is refused (the holder's late answer too: the token moves on) and counts as undone; the undo
// then cancels whatever the cut-off call did at the third party.
const common::pg::Statement kCutOffPending{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = 409,
      response_content_type = 'application/problem+json', response_body = $3, response_headers = '{}', lease_expires_at = NULL,
      fencing_token = fencing_token + 1, compensated_at = now(),
      expires_at = now() + make_interval(secs => $4)
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending'
    AND lease_expires_at <= now())sql"};

// The undone action is kept a full retention from now: a late retry of its key must keep
// hearing "compensated", never find the key free again.
const common::pg::Statement kMarkCompensated{R"sql(
  UPDATE idempotency_keys
  SET compensated_at = now(), expires_at = now() + make_interval(secs => $3)
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kDeleteExpired{R"sql(
  DELETE FROM idempotency_keys
  WHERE ctid IN (SELECT ctid FROM idempotency_keys
                 -- a pending key is an effect in doubt: kept until a retry or a compensation
                 -- settles it, or a later claim would not be told of the earlier attempt
                 WHERE expires_at < now() AND status <> 'pending' LIMIT $1))sql"};

// Every write sets expires_at to now() + retention, so a key written or compensated in the
// last `since` expires later than now() + retention - since.
const common::pg::Statement kListKeys{R"sql(
  SELECT idempotency_key, status, coalesce(response_status, 0), compensated_at IS NOT NULL,
         extract(epoch FROM now() - created_at)::float8
  FROM idempotency_keys
  WHERE tenant_id = $1 AND expires_at > now() + make_interval(secs => $2::float8 - $3::float8)
    AND idempotency_key > $4
  ORDER BY idempotency_key LIMIT $5)sql"};

}  // namespace idemsaga::steps::guard::detail
