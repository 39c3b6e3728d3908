-- Effects outside the database (a card network, an e-mail provider): the key is claimed as
-- 'pending' with a lease and a fencing token in one short transaction, the call goes out with
-- no transaction open, and only the holder of the current token may record its answer. A
-- holder that died mid-call leaves its lease to expire; the next request with the key takes
-- the claim over under the next token. ADD COLUMN with a constant default rewrites nothing.
ALTER DOMAIN guard_key_status DROP CONSTRAINT guard_key_status_check;
ALTER DOMAIN guard_key_status ADD CONSTRAINT guard_key_status_check
  CHECK (VALUE IN ('started', 'pending', 'completed', 'tombstone'));

ALTER TABLE idempotency_keys
  ADD COLUMN lease_expires_at timestamptz,
  ADD COLUMN fencing_token bigint NOT NULL DEFAULT 0,
  DROP CONSTRAINT idempotency_keys_state,
  ADD CONSTRAINT idempotency_keys_state CHECK (
    (status IN ('started', 'pending')
     OR (response_status IS NOT NULL AND response_body IS NOT NULL
         AND response_content_type IS NOT NULL))
    AND (status = 'tombstone') = (request_hash IS NULL)
    AND (status = 'pending') = (lease_expires_at IS NOT NULL));
