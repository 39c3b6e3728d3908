-- The demo inventory participant: one warehouse shared by all tenants.
CREATE TABLE stock (
  sku       text   PRIMARY KEY CHECK (sku ~ '^[a-z0-9_-]{1,64}$'),
  available bigint NOT NULL CHECK (available >= 0),
  reserved  bigint NOT NULL CHECK (reserved >= 0)
);
COMMENT ON TABLE stock IS 'Units on hand per SKU: available to reserve, and held by reservations.';

CREATE TABLE reservations (
  reservation_id  text        PRIMARY KEY,
  tenant_id       text        NOT NULL,
  idempotency_key text        NOT NULL,
  items           jsonb       NOT NULL,
  status          text        NOT NULL CHECK (status IN ('reserved', 'released')),
  created_at      timestamptz NOT NULL DEFAULT now(),
  released_at     timestamptz,
  -- A second line of defence behind the guard: one reservation per step key.
  UNIQUE (tenant_id, idempotency_key),
  CHECK ((status = 'released') = (released_at IS NOT NULL))
);
COMMENT ON TABLE reservations IS
  'Stock held for an order step; released by its compensation. Counted by tests and checkers.';

-- Seeded stock, documented in the README: plenty of widgets, few gadgets (to run out).
INSERT INTO stock (sku, available, reserved) VALUES ('widget', 1000000, 0), ('gadget', 10, 0);
