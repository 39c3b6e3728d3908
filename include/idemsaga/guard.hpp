// Guard a participant's effects with idempotency keys in its own PostgreSQL database.
//   #include <idemsaga/guard.hpp>
//   common::pg::Migrate(conn, "guard");  // the key table
//   steps::guard::Guard guard(pool);
#pragma once

#include "common/http/server.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/pool.hpp"
#include "common/pg/url.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"
