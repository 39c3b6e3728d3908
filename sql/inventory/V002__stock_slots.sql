-- A SKU's units are spread over 16 slots (a slotted counter). With one row per SKU, every
-- reservation of a popular SKU waited for the previous one's row lock, held through its
-- commit's WAL flush: one SKU served only one reservation per fsync. A reservation now takes
-- the first slot that nobody holds and that has enough units; `stock` stays as the sum.
CREATE TABLE stock_slots (
  sku       text     NOT NULL CHECK (sku ~ '^[a-z0-9_-]{1,64}$'),
  slot      smallint NOT NULL CHECK (slot >= 0 AND slot < 16),
  available bigint   NOT NULL CHECK (available >= 0),
  reserved  bigint   NOT NULL CHECK (reserved >= 0),
  PRIMARY KEY (sku, slot)
);
COMMENT ON TABLE stock_slots IS
  'Units on hand per SKU and slot; a SKU''s stock is the sum over its 16 slots.';

-- Units spread evenly; what is reserved today stays in slot 0, where releases of reservations
-- made before this migration (they name no slot) give it back.
INSERT INTO stock_slots (sku, slot, available, reserved)
SELECT s.sku, g.slot, s.available / 16 + (g.slot < s.available % 16)::int,
       CASE WHEN g.slot = 0 THEN s.reserved ELSE 0 END
FROM stock s CROSS JOIN generate_series(0, 15) AS g(slot);

DROP TABLE stock;
CREATE VIEW stock AS
  SELECT sku, sum(available)::bigint AS available, sum(reserved)::bigint AS reserved
  FROM stock_slots GROUP BY sku;
COMMENT ON VIEW stock IS 'Units on hand per SKU: available to reserve, and held by reservations.';

-- Where each reserved unit came from, so that a release gives it back to the same slot:
-- [{"sku": ..., "slot": ..., "quantity": ...}]. NULL for reservations made before slots.
ALTER TABLE reservations ADD COLUMN slots jsonb;
