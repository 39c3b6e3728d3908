-- The participant-side idempotency guard (steps/guard). Applied to every participant database.
CREATE TABLE idempotency_keys (
  tenant_id             text        NOT NULL CHECK (tenant_id ~ '^[A-Za-z0-9_-]{1,64}$'),
  idempotency_key       text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
  -- SHA-256 of method, path and canonical JSON body; NULL for a tombstone (never requested).
  request_hash          text        CHECK (request_hash ~ '^[0-9a-f]{64}$'),
  -- 'started' exists only inside the claiming transaction: the claim, the effect and the
  -- stored response commit together, so no other session ever sees it.
  status                text        NOT NULL CHECK (status IN ('started', 'completed', 'tombstone')),
  response_status       integer     CHECK (response_status BETWEEN 100 AND 599),
  response_content_type text,
  response_body         text,
  -- Set once when a compensation has undone this action: undo happens at most once.
  compensated_at        timestamptz,
  created_at            timestamptz NOT NULL DEFAULT now(),
  expires_at            timestamptz NOT NULL DEFAULT now() + interval '7 days',
  PRIMARY KEY (tenant_id, idempotency_key),
  CHECK (status = 'started' OR (response_status IS NOT NULL AND response_body IS NOT NULL
                                AND response_content_type IS NOT NULL)),
  CHECK ((status = 'tombstone') = (request_hash IS NULL))
);
COMMENT ON TABLE idempotency_keys IS
  'One row per (tenant, step key) a participant has answered: the stored response replayed to '
  'every retry, or a tombstone that refuses an action whose compensation arrived first.';
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
