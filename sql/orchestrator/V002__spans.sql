-- Traces: spans from all three services (OTLP), stored so a flow is inspectable with no
-- other system.
CREATE TABLE spans (
  trace_id        text        NOT NULL CHECK (trace_id ~ '^[0-9a-f]{32}$'),
  span_id         text        NOT NULL CHECK (span_id ~ '^[0-9a-f]{16}$'),
  parent_span_id  text        CHECK (parent_span_id ~ '^[0-9a-f]{16}$'),
  service         text        NOT NULL,
  name            text        NOT NULL,
  kind            smallint    NOT NULL,
  start_unix_nano bigint      NOT NULL,
  end_unix_nano   bigint      NOT NULL,
  status          text        NOT NULL CHECK (status IN ('unset', 'ok', 'error')),
  status_message  text        NOT NULL DEFAULT '',
  attributes      jsonb       NOT NULL DEFAULT '{}',
  received_at     timestamptz NOT NULL DEFAULT now(),
  -- An exporter may deliver a batch twice (a retry after a lost answer): keep one copy.
  PRIMARY KEY (trace_id, span_id)
);
COMMENT ON TABLE spans IS
  'Spans of every service, by trace; read through an order''s key (tenant-scoped) and deleted '
  'with it.';
CREATE INDEX spans_received_at ON spans (received_at);

-- The order request's span: a saga resumed elsewhere hangs its spans under it.
ALTER TABLE idempotency_keys ADD COLUMN root_span_id text CHECK (root_span_id ~ '^[0-9a-f]{16}$');
CREATE INDEX idempotency_keys_trace_id ON idempotency_keys (trace_id);
