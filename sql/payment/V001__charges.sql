-- The demo payment participant.
CREATE TABLE charges (
  charge_id       text        PRIMARY KEY,
  tenant_id       text        NOT NULL,
  idempotency_key text        NOT NULL,
  customer_id     text        NOT NULL,
  amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
  currency        text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
  payment_method  text        NOT NULL,
  status          text        NOT NULL CHECK (status IN ('captured', 'refunded')),
  created_at      timestamptz NOT NULL DEFAULT now(),
  refunded_at     timestamptz,
  -- A second line of defence behind the guard: one charge per step key.
  UNIQUE (tenant_id, idempotency_key),
  CHECK ((status = 'refunded') = (refunded_at IS NOT NULL))
);
COMMENT ON TABLE charges IS
  'Money taken for an order step; refunded by its compensation. Counted by tests and checkers.';
