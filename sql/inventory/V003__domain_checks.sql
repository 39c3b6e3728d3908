-- Each column's own rule as a domain, read once per connection instead of at every INSERT and
-- UPDATE (see orchestrator V005). Restart processes of an older build after it.
CREATE DOMAIN sku_text AS text CHECK (VALUE ~ '^[a-z0-9_-]{1,64}$');
CREATE DOMAIN slot_number AS smallint CHECK (VALUE >= 0 AND VALUE < 16);
CREATE DOMAIN units AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN reservation_status AS text CHECK (VALUE IN ('reserved', 'released'));

-- The view reads the columns whose types change.
DROP VIEW stock;
ALTER TABLE stock_slots
  DROP CONSTRAINT stock_slots_sku_check,
  DROP CONSTRAINT stock_slots_slot_check,
  DROP CONSTRAINT stock_slots_available_check,
  DROP CONSTRAINT stock_slots_reserved_check,
  ALTER COLUMN sku TYPE sku_text,
  ALTER COLUMN slot TYPE slot_number,
  ALTER COLUMN available TYPE units,
  ALTER COLUMN reserved TYPE units;
CREATE VIEW stock AS
  SELECT sku::text AS sku, sum(available)::bigint AS available, sum(reserved)::bigint AS reserved
  FROM stock_slots GROUP BY sku;
COMMENT ON VIEW stock IS 'Units on hand per SKU: available to reserve, and held by reservations.';

ALTER TABLE reservations
  DROP CONSTRAINT reservations_status_check,
  ALTER COLUMN status TYPE reservation_status;
