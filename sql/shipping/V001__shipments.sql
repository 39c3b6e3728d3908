-- The demo shipping participant. Each column's own rule is a domain from the start, read once
-- per connection instead of at every INSERT and UPDATE (see orchestrator V005); the rule
-- between columns is one CHECK.
CREATE DOMAIN shipment_id_text AS text CHECK (VALUE ~ '^shp_[0-9a-f]{32}$');
CREATE DOMAIN reservation_ref AS text CHECK (VALUE ~ '^res_[0-9a-f]{32}$');
-- What steps::ValidateShipment accepts: an object whose country is ISO 3166-1 alpha-2.
CREATE DOMAIN shipping_address AS jsonb
  CHECK (jsonb_typeof(VALUE) = 'object' AND VALUE->>'country' ~ '^[A-Z]{2}$');
CREATE DOMAIN shipment_status AS text CHECK (VALUE IN ('created', 'cancelled'));

CREATE TABLE shipments (
  shipment_id     shipment_id_text PRIMARY KEY,
  tenant_id       text             NOT NULL,
  idempotency_key text             NOT NULL,
  reservation_id  reservation_ref  NOT NULL,
  address         shipping_address NOT NULL,
  status          shipment_status  NOT NULL,
  created_at      timestamptz      NOT NULL DEFAULT now(),
  cancelled_at    timestamptz,
  -- A second line of defence behind the guard: one shipment per step key.
  UNIQUE (tenant_id, idempotency_key),
  CONSTRAINT shipments_cancelled_at CHECK ((status = 'cancelled') = (cancelled_at IS NOT NULL))
);
COMMENT ON TABLE shipments IS
  'Parcels booked for an order step''s reserved stock; cancelled by its compensation. Counted '
  'by tests and checkers.';
