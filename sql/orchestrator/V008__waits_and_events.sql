-- Sagas that wait for external events (issue: an engine where waiting costs no thread).
--
-- `waiting_for` is set when a running saga parks: the events that should wake it before its
-- lease runs out ('{}' for a park that only an operator's cancel should cut short), and
-- cleared by every takeover. A delivery wakes the saga only while it is parked on that
-- event, so a saga some replica is running keeps its lease.
-- Nullable without a default: adding it rewrites nothing and locks only briefly.
ALTER TABLE idempotency_keys ADD COLUMN waiting_for text[];
COMMENT ON COLUMN idempotency_keys.waiting_for IS
  'While parked: the events whose delivery wakes this saga (empty: none); NULL otherwise.';

CREATE TABLE saga_events (
  tenant_id        text        NOT NULL,
  idempotency_key  text        NOT NULL,  -- the run's key
  name             text        NOT NULL CHECK (name ~ '^[a-z0-9_]{1,32}$'),
  -- The event's own Idempotency-Key and fingerprint: a retry replays, a reuse is refused.
  event_key        text        NOT NULL CHECK (length(event_key) BETWEEN 1 AND 200),
  request_hash     text        NOT NULL CHECK (request_hash ~ '^[0-9a-f]{64}$'),
  payload          jsonb       NOT NULL,
  response_status  integer     NOT NULL CHECK (response_status BETWEEN 200 AND 299),
  response_body    text        NOT NULL,
  received_at      timestamptz NOT NULL DEFAULT now(),
  -- When the run's wait took it: every later owner takes the same one, and the wait's other
  -- events are refused from then on.
  taken_at         timestamptz,
  -- One delivery per event name and run: the first wins, whoever sends it and however often.
  PRIMARY KEY (tenant_id, idempotency_key, name),
  -- Gone with the run when garbage collection deletes it.
  FOREIGN KEY (tenant_id, idempotency_key) REFERENCES idempotency_keys ON DELETE CASCADE
);
COMMENT ON TABLE saga_events IS
  'External events delivered to a saga run (POST /v1/runs/{saga}/{key}/events/{name}), kept '
  'until the run reads them, and their answers, replayed to every retry.';
