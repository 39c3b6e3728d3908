-- Operators' decisions on a saga, kept with it (issue: operable): a requested cancel (the
-- running saga stops at its next step boundary and compensates what ran) and the resolution
-- of a stuck compensation fixed by hand. Each is {"operator", "reason" | "note", "at"}.
-- Nullable columns without a default: adding them rewrites nothing and locks only briefly.
ALTER TABLE idempotency_keys ADD COLUMN cancel_requested jsonb, ADD COLUMN resolution jsonb;
COMMENT ON COLUMN idempotency_keys.cancel_requested IS
  'Who asked to cancel this saga, why and when (POST /v1/sagas/{key}/cancel).';
COMMENT ON COLUMN idempotency_keys.resolution IS
  'Who ended this stuck compensation by hand, their note and when (POST /v1/sagas/{key}/resolve).';
