-- The directory database of a deployment whose tenants live on several PostgreSQL clusters
-- (docs/scaling.md, "Tenants on several clusters"): which cluster holds each tenant's
-- orchestrator and participant rows. Every service of a cluster reads the whole table every
-- half second and serves only the tenants placed on its own cluster.
CREATE TABLE tenant_placement (
  tenant_id  text        PRIMARY KEY CHECK (tenant_id ~ '^[A-Za-z0-9_-]{1,64}$'),
  cluster    text        NOT NULL CHECK (cluster ~ '^[a-z0-9_-]{1,64}$'),
  -- active: its cluster serves it. draining (a move has begun): its cluster's orchestrator takes
  -- no new request of it, while the participants still serve its running sagas to their end.
  -- frozen: nothing serves it while its rows are copied to `moving_to`.
  state      text        NOT NULL DEFAULT 'active'
             CHECK (state IN ('active', 'draining', 'frozen')),
  moving_to  text        CHECK (moving_to ~ '^[a-z0-9_-]{1,64}$'),
  updated_at timestamptz NOT NULL DEFAULT now(),
  CHECK ((state = 'active') = (moving_to IS NULL))
);
COMMENT ON TABLE tenant_placement IS
  'Which PostgreSQL cluster holds each tenant''s rows, and the state of a move '
  '(idemsaga tenant move); read by every service of every cluster.';
