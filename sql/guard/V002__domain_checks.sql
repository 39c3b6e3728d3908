-- PostgreSQL reads a table's CHECK constraints back from their stored text, and plans them, at
-- every INSERT and UPDATE (see orchestrator V005); a domain's constraints are read once per
-- connection. Each column's own rule becomes a domain, the rules between columns one CHECK.
-- Restart processes of an older build after this migration (their prepared statements return
-- the old types, which PostgreSQL refuses to run again).
CREATE DOMAIN guard_tenant_id AS text CHECK (VALUE ~ '^[A-Za-z0-9_-]{1,64}$');
CREATE DOMAIN guard_key_text AS text CHECK (length(VALUE) BETWEEN 1 AND 255);
CREATE DOMAIN guard_sha256_hex AS text CHECK (VALUE ~ '^[0-9a-f]{64}$');
CREATE DOMAIN guard_key_status AS text CHECK (VALUE IN ('started', 'completed', 'tombstone'));
CREATE DOMAIN guard_http_status AS integer CHECK (VALUE BETWEEN 100 AND 599);

ALTER TABLE idempotency_keys
  DROP CONSTRAINT idempotency_keys_check,
  DROP CONSTRAINT idempotency_keys_check1,
  DROP CONSTRAINT idempotency_keys_idempotency_key_check,
  DROP CONSTRAINT idempotency_keys_request_hash_check,
  DROP CONSTRAINT idempotency_keys_response_status_check,
  DROP CONSTRAINT idempotency_keys_status_check,
  DROP CONSTRAINT idempotency_keys_tenant_id_check,
  ALTER COLUMN tenant_id TYPE guard_tenant_id,
  ALTER COLUMN idempotency_key TYPE guard_key_text,
  ALTER COLUMN request_hash TYPE guard_sha256_hex,
  ALTER COLUMN status TYPE guard_key_status,
  ALTER COLUMN response_status TYPE guard_http_status,
  -- Answered unless merely started; a tombstone alone has no request.
  ADD CONSTRAINT idempotency_keys_state CHECK (
    (status = 'started'
     OR (response_status IS NOT NULL AND response_body IS NOT NULL
         AND response_content_type IS NOT NULL))
    AND (status = 'tombstone') = (request_hash IS NULL));
