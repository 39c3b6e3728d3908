-- Saga steps over messaging (issue 34, part 5): a step publishes its command to the
-- participant's queue and parks; the participant's reply, consumed from the orchestrator's
-- reply queue, is kept here until the run reads it, and wakes the run.
--
-- One row per derived key sent over a queue (an action's, or a compensation's): written before
-- each publish (no transaction open across it), answered by the first reply that names it
-- (`correlation`); later replies for it, duplicates or late ones, change nothing.
CREATE TABLE saga_step_replies (
  tenant_id        text        NOT NULL,
  idempotency_key  text        NOT NULL,  -- the run's key
  derived_key      text        NOT NULL CHECK (length(derived_key) BETWEEN 1 AND 255),
  -- sha256 hex of derived_key: what the command's correlation_id carries (with the tenant),
  -- since a derived key may be longer than AMQP's 255-byte correlation_id allows.
  correlation      text        NOT NULL CHECK (correlation ~ '^[0-9a-f]{64}$'),
  publishes        integer     NOT NULL DEFAULT 1,
  published_at     timestamptz NOT NULL DEFAULT now(),
  reply_status     integer     CHECK (reply_status BETWEEN 100 AND 599),
  reply_retry_after text,
  reply_body       text,
  replied_at       timestamptz,
  replies          integer     NOT NULL DEFAULT 0,  -- every reply that named it, duplicates too
  PRIMARY KEY (tenant_id, correlation),
  -- Gone with the run when garbage collection deletes it.
  FOREIGN KEY (tenant_id, idempotency_key) REFERENCES idempotency_keys ON DELETE CASCADE
);
COMMENT ON TABLE saga_step_replies IS
  'Commands a saga step published to a participant queue, and the first reply to each.';
