-- The admin listing's index led with tenant_id, as the primary key does. Until autovacuum first
-- analyses the table (a minute or more after a deploy: thousands of orders), the planner cannot
-- tell the two apart, and the cached plans of the claim and the finish took the listing's: each
-- read every key of the tenant (1,356 index entries a claim after 3,000 orders).
--
-- Two partial indexes instead, one per kind of status. A statement about one key never states a
-- status class (NOT IN proves nothing for a partial index), so only the primary key serves it;
-- the listing states the class in each branch and reads a branch newest first.
DROP INDEX idempotency_keys_tenant_status;
CREATE INDEX idempotency_keys_listing_running ON idempotency_keys (tenant_id, created_at DESC)
  WHERE status IN ('started', 'compensating');
CREATE INDEX idempotency_keys_listing_finished ON idempotency_keys (tenant_id, created_at DESC)
  WHERE status IN ('completed', 'failed');
