-- The version of the saga definition a key's saga started with (issue: your own sagas): a
-- resumed saga runs exactly that definition, and goes visibly stuck when this build has none.
-- Rows from before versions were recorded ran version 1, the only one there was.
-- A plain integer: a column of a domain with a CHECK (or a CHECK here) would make PostgreSQL
-- rewrite the whole table under an exclusive lock to add it, stopping every claim meanwhile.
-- saga::Definition refuses a version below 1.
ALTER TABLE idempotency_keys ADD COLUMN saga_version integer NOT NULL DEFAULT 1;
COMMENT ON COLUMN idempotency_keys.saga_version IS
  'Definition version of saga_name this saga runs (saga::Registry).';
