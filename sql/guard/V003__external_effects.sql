-- Effects outside the database (a card network, an e-mail provider): the key is claimed as
-- 'pending' with a lease and a fencing token in one short transaction, the call goes out with
-- no transaction open, and only the holder of the current token may record its answer. A
-- holder that died mid-call leaves its lease to expire; the next request with the key takes
-- the claim over under the next token. ADD COLUMN with a constant default rewrites nothing,
-- and the constraints are added NOT VALID: they hold for every row written from now on, and
-- the rows before this migration satisfy them by construction (none is pending, no lease is
-- set), so the exclusive lock is held for moments instead of a scan of a week of keys.
-- (Validating them later would not help here: pending migrations apply in one transaction.)
ALTER DOMAIN guard_key_status DROP CONSTRAINT guard_key_status_check;
ALTER DOMAIN guard_key_status ADD CONSTRAINT guard_key_status_check
  CHECK (VALUE IN ('started', 'pending', 'completed', 'tombstone')) NOT VALID;

ALTER TABLE idempotency_keys
  ADD COLUMN lease_expires_at timestamptz,
  ADD COLUMN fencing_token bigint NOT NULL DEFAULT 0,
  DROP CONSTRAINT idempotency_keys_state,
  ADD CONSTRAINT idempotency_keys_state CHECK (
    (status IN ('started', 'pending')
     OR (response_status IS NOT NULL AND response_body IS NOT NULL
         AND response_content_type IS NOT NULL))
    AND (status = 'tombstone') = (request_hash IS NULL)
    AND (status = 'pending') = (lease_expires_at IS NOT NULL)) NOT VALID;

COMMENT ON COLUMN idempotency_keys.lease_expires_at IS
  'Pending (external) claims only: until when the holder may call out and record its answer; '
  'after it, the next request with the key takes the claim over.';
COMMENT ON COLUMN idempotency_keys.fencing_token IS
  'Grows with each takeover of a pending claim; only the holder of the current token may '
  'record the answer (0 for keys that were never pending).';
