-- Spans arrive by the thousand per second and are read a trace at a time, rarely. One row per
-- span cost three index entries per span (14 spans an order): a third of the stack's CPU under
-- order load went to storing spans. Now one row holds the spans of one trace from one exported
-- batch, as a JSON array kept as sent (json, not jsonb: it is not parsed again on the way in).
CREATE TABLE trace_spans (
  trace_id    text        NOT NULL CHECK (trace_id ~ '^[0-9a-f]{32}$'),
  received_at timestamptz NOT NULL DEFAULT now(),
  -- [{"span_id","parent_span_id","service","name","kind","start_unix_nano","end_unix_nano",
  --   "status","status_message","attributes"}]; a batch delivered twice is deduplicated by
  -- span_id when read.
  spans       json        NOT NULL
);
COMMENT ON TABLE trace_spans IS
  'Spans of every service, a trace''s batch per row; read through an order''s key '
  '(tenant-scoped) and deleted with it. The view spans shows one row per span.';
CREATE INDEX trace_spans_trace_id ON trace_spans (trace_id);
-- Rows arrive in time order: a BRIN index finds old ones for almost no upkeep.
CREATE INDEX trace_spans_received_at ON trace_spans USING brin (received_at);

INSERT INTO trace_spans (trace_id, received_at, spans)
SELECT trace_id, max(received_at),
       json_agg(json_build_object(
         'span_id', span_id, 'parent_span_id', coalesce(parent_span_id, ''), 'service', service,
         'name', name, 'kind', kind, 'start_unix_nano', start_unix_nano,
         'end_unix_nano', end_unix_nano, 'status', status, 'status_message', status_message,
         'attributes', attributes))
FROM spans GROUP BY trace_id;
DROP TABLE spans;

-- For people reading traces with SQL: one row per span, as before.
CREATE VIEW spans AS
SELECT b.trace_id, s->>'span_id' AS span_id, nullif(s->>'parent_span_id', '') AS parent_span_id,
       s->>'service' AS service, s->>'name' AS name, (s->>'kind')::smallint AS kind,
       (s->>'start_unix_nano')::bigint AS start_unix_nano,
       (s->>'end_unix_nano')::bigint AS end_unix_nano, s->>'status' AS status,
       s->>'status_message' AS status_message, (s->'attributes')::jsonb AS attributes,
       b.received_at
FROM trace_spans b CROSS JOIN json_array_elements(b.spans) AS s;
