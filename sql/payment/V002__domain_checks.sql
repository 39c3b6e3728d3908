-- Each column's own rule as a domain, read once per connection instead of at every INSERT and
-- UPDATE (see orchestrator V005). Restart processes of an older build after it.
CREATE DOMAIN amount_cents AS bigint CHECK (VALUE > 0);
CREATE DOMAIN currency_code AS text CHECK (VALUE ~ '^[A-Z]{3}$');
CREATE DOMAIN charge_status AS text CHECK (VALUE IN ('captured', 'refunded'));

ALTER TABLE charges
  DROP CONSTRAINT charges_amount_cents_check,
  DROP CONSTRAINT charges_currency_check,
  DROP CONSTRAINT charges_status_check,
  ALTER COLUMN amount_cents TYPE amount_cents,
  ALTER COLUMN currency TYPE currency_code,
  ALTER COLUMN status TYPE charge_status;
