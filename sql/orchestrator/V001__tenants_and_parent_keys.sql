-- The orchestrator's database: who may call it, and one row per order (parent key).
CREATE TABLE tenants (
  tenant_id    text        PRIMARY KEY CHECK (tenant_id ~ '^[A-Za-z0-9_-]{1,64}$'),
  -- SHA-256 of the API key: keys are 256-bit random tokens, so a fast hash is enough and the
  -- database never holds a usable credential.
  api_key_hash text        NOT NULL UNIQUE CHECK (api_key_hash ~ '^[0-9a-f]{64}$'),
  created_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tenants IS 'API callers; every key, saga and span is scoped to one of them.';

CREATE TABLE idempotency_keys (
  tenant_id        text        NOT NULL REFERENCES tenants,
  idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
  -- SHA-256 of the canonical request: a reuse with another payload is refused (422).
  request_hash     text        NOT NULL CHECK (request_hash ~ '^[0-9a-f]{64}$'),
  -- Kept so that recovery can re-drive the saga after a crash.
  request_body     jsonb       NOT NULL,
  saga_name        text        NOT NULL,
  order_id         text        NOT NULL UNIQUE,
  status           text        NOT NULL
                   CHECK (status IN ('started', 'compensating', 'completed', 'failed')),
  -- The lease: only its owner at its epoch may write; times are the database's clock.
  lease_owner      text,
  lease_epoch      bigint      NOT NULL DEFAULT 1 CHECK (lease_epoch >= 1),
  lease_expires_at timestamptz,
  -- Step outcomes: written with the completion, or with the decision to compensate.
  steps            jsonb       NOT NULL DEFAULT '[]',
  failed_step      text,
  failure          jsonb,
  -- A compensation keeps failing: shown by the API and metrics, retried at a slower pace.
  stuck            boolean     NOT NULL DEFAULT false,
  response_status  integer     CHECK (response_status BETWEEN 100 AND 599),
  response_headers jsonb,
  response_body    text,
  trace_id         text        NOT NULL CHECK (trace_id ~ '^[0-9a-f]{32}$'),
  created_at       timestamptz NOT NULL DEFAULT now(),
  updated_at       timestamptz NOT NULL DEFAULT now(),
  completed_at     timestamptz,
  expires_at       timestamptz NOT NULL,
  PRIMARY KEY (tenant_id, idempotency_key),
  -- A finished saga has a stored response and no lease; a running one has a lease.
  CHECK ((status IN ('completed', 'failed')) = (response_status IS NOT NULL)),
  CHECK ((status IN ('completed', 'failed')) = (completed_at IS NOT NULL)),
  CHECK ((status IN ('started', 'compensating')) = (lease_expires_at IS NOT NULL))
);
COMMENT ON TABLE idempotency_keys IS
  'One row per (tenant, Idempotency-Key): the saga''s state and lease while it runs, and the '
  'response replayed byte for byte to every retry once it has ended.';
-- The recovery sweeper's scan: running sagas by lease expiry.
CREATE INDEX idempotency_keys_running ON idempotency_keys (lease_expires_at)
  WHERE status IN ('started', 'compensating');
-- Listing a tenant's sagas by state, newest first.
CREATE INDEX idempotency_keys_tenant_status ON idempotency_keys (tenant_id, status, created_at DESC);
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at)
  WHERE status IN ('completed', 'failed');
