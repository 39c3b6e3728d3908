-- PostgreSQL reads a table's CHECK constraints back from their stored text, and plans them, at
-- every INSERT and UPDATE. Ten of them were 0.13 ms of the claim's 0.32 and of the finish's
-- 0.28 (pg_stat_statements; `pg_strtok` and `strtoll` ranked high in a profile of the cluster).
-- A domain's constraints are read once per connection (the type cache). So each column's own
-- rule becomes a domain, and the rules between columns become one CHECK.
--
-- A column whose type changes changes the result type of the statements that return it: a
-- process of an older build prepared them before this migration, and PostgreSQL refuses to run
-- them again ("cached plan must not change result type"). Restart such processes after it.
CREATE DOMAIN key_text AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN sha256_hex AS text CHECK (VALUE ~ '^[0-9a-f]{64}$');
CREATE DOMAIN trace_id_hex AS text CHECK (VALUE ~ '^[0-9a-f]{32}$');
CREATE DOMAIN span_id_hex AS text CHECK (VALUE ~ '^[0-9a-f]{16}$');
CREATE DOMAIN saga_status AS text
  CHECK (VALUE IN ('started', 'compensating', 'completed', 'failed'));
CREATE DOMAIN http_status AS integer CHECK (VALUE BETWEEN 100 AND 599);
CREATE DOMAIN lease_epoch_number AS bigint CHECK (VALUE >= 1);

ALTER TABLE idempotency_keys
  DROP CONSTRAINT idempotency_keys_check,
  DROP CONSTRAINT idempotency_keys_check1,
  DROP CONSTRAINT idempotency_keys_check2,
  DROP CONSTRAINT idempotency_keys_idempotency_key_check,
  DROP CONSTRAINT idempotency_keys_lease_epoch_check,
  DROP CONSTRAINT idempotency_keys_request_hash_check,
  DROP CONSTRAINT idempotency_keys_response_status_check,
  DROP CONSTRAINT idempotency_keys_root_span_id_check,
  DROP CONSTRAINT idempotency_keys_status_check,
  DROP CONSTRAINT idempotency_keys_trace_id_check,
  ALTER COLUMN idempotency_key TYPE key_text,
  ALTER COLUMN request_hash TYPE sha256_hex,
  ALTER COLUMN status TYPE saga_status,
  ALTER COLUMN lease_epoch TYPE lease_epoch_number,
  ALTER COLUMN response_status TYPE http_status,
  ALTER COLUMN trace_id TYPE trace_id_hex,
  ALTER COLUMN root_span_id TYPE span_id_hex,
  -- Finished (completed or failed) exactly when it has an answer and an end; running
  -- (started or compensating) exactly when it holds a lease.
  ADD CONSTRAINT idempotency_keys_state CHECK (
    (completed_at IS NULL) = (status <> 'completed' AND status <> 'failed')
    AND (response_status IS NULL) = (completed_at IS NULL)
    AND (lease_expires_at IS NULL) <> (completed_at IS NULL));
