-- A card that needs 3-D Secure (pm_card_3ds): the charge is authorised and waits for the card
-- holder's confirmation (requires_action) until a capture takes it (captured) or a refund voids
-- it (refunded). The domain's rule widens; no row changes.
ALTER DOMAIN charge_status DROP CONSTRAINT charge_status_check;
ALTER DOMAIN charge_status ADD CONSTRAINT charge_status_check
  CHECK (VALUE IN ('requires_action', 'captured', 'refunded'));
