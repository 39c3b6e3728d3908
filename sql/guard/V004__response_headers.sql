-- The response headers that matter besides Content-Type (Location, and any the handler names),
-- stored with the answer and replayed with it.
ALTER TABLE idempotency_keys ADD COLUMN response_headers jsonb NOT NULL DEFAULT '{}';
