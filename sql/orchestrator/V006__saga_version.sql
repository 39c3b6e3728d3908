-- The version of the saga definition a key's saga started with (issue: your own sagas): a
-- resumed saga runs exactly that definition, and goes visibly stuck when this build has none.
-- Rows from before versions were recorded ran version 1, the only one there was.
CREATE DOMAIN saga_version_number AS integer CHECK (VALUE >= 1);
ALTER TABLE idempotency_keys ADD COLUMN saga_version saga_version_number NOT NULL DEFAULT 1;
COMMENT ON COLUMN idempotency_keys.saga_version IS
  'Definition version of saga_name this saga runs (saga::Registry).';
