#include "common/pg/pool.hpp"

#include <poll.h>

#include <pqxx/pqxx>

#include "common/pg/url.hpp"

namespace idemsaga::common::pg {
namespace {

// Failures that stay with the session, so that every later use of the connection would fail
// the same way; a new connection does not.
bool DiscardsTheSession(const std::string& sqlstate) {
  // The session lost its prepared statements (DEALLOCATE, DISCARD ALL, a pooler between us
  // and the server) while libpqxx still counts them as prepared: a new one prepares afresh.
  if (sqlstate == "26000") return true;
  // A standby (read_only_sql_transaction): after a failover the session is on a server that
  // is not, or no longer, the primary; a new connection through HAProxy or a multi-host URL
  // with target_session_attrs=read-write reaches the one that is.
  if (sqlstate == "25006") return true;
  // The server is shutting down, crashed, or is not accepting sessions yet (57P01..57P03):
  // this session is ending whatever libpq has noticed so far.
  return sqlstate == "57P01" || sqlstate == "57P02" || sqlstate == "57P03";
}

// An idle session has nothing to say: a readable socket (end of file, or the FATAL message a
// server sends before it closes) means the server or a proxy in between ended it while it sat
// in the pool. A failover does that to every session of the old primary (HAProxy cuts them);
// lending one would fail the borrower's first statement. poll() with no wait costs no time.
bool EndedWhileIdle(pqxx::connection& conn) {
  int fd = conn.sock();
  if (fd < 0) return true;
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, 0) != 0;
}

}  // namespace

Pool::Lease::Lease(Pool* pool, std::unique_ptr<pqxx::connection> conn)
    : pool_(pool), conn_(std::move(conn)) {}

Pool::Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), conn_(std::move(other.conn_)), discard_(other.discard_) {
  other.pool_ = nullptr;
}

Pool::Lease::~Lease() {
  if (pool_ != nullptr) pool_->Return(std::move(conn_), discard_);
}

Pool::Pool(Options options)
    : url_(WithSessionTimeouts(options.url)), options_(std::move(options)) {}

Pool::~Pool() = default;

Pool::Lease Pool::Borrow() {
  // Declared before the lock, so that these disconnect after it is released.
  std::vector<std::unique_ptr<pqxx::connection>> ended;
  std::unique_lock lock(mutex_);
  auto free = [&] { return !idle_.empty() || open_ < options_.size; };
  if (!free()) {
    auto start = std::chrono::steady_clock::now();
    bool ok = available_.wait_for(lock, options_.borrow_timeout, free);
    ++waits_.waits;
    waits_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!ok) {
      ++waits_.timeouts;
      throw PoolUnavailable("no database connection became free in time");
    }
  }
  while (!idle_.empty()) {
    auto conn = std::move(idle_.back());
    idle_.pop_back();
    if (!EndedWhileIdle(*conn)) return Lease(this, std::move(conn));
    --open_;  // its slot is refilled below
    ended.push_back(std::move(conn));
  }
  ++open_;  // reserve the slot, connect outside the lock
  lock.unlock();
  try {
    return Lease(this, std::make_unique<pqxx::connection>(url_));
  } catch (const std::exception& e) {
    lock.lock();
    --open_;
    available_.notify_one();
    throw PoolUnavailable(std::string("cannot connect to the database: ") + e.what());
  }
}

bool Reachable(Pool& pool) {
  try {
    pool.With([](pqxx::connection& conn) {
      pqxx::nontransaction tx(conn);
      tx.exec("SELECT 1");
    });
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

Pool::Waits Pool::waits() const {
  std::lock_guard lock(mutex_);
  return waits_;
}

void Pool::Return(std::unique_ptr<pqxx::connection> conn, bool discard) {
  bool keep = conn && !discard && conn->is_open();
  std::unique_ptr<pqxx::connection> closing;
  {
    std::lock_guard lock(mutex_);
    if (keep) {
      idle_.push_back(std::move(conn));
    } else {
      closing = std::move(conn);
      --open_;
    }
  }
  available_.notify_one();
  // `closing` disconnects here, outside the lock.
}

void Pool::DiscardIfBroken(Lease& lease) {
  try {
    throw;
  } catch (const pqxx::broken_connection&) {
    lease.Discard();
  } catch (const pqxx::in_doubt_error&) {
    lease.Discard();
  } catch (const pqxx::sql_error& e) {
    if (DiscardsTheSession(e.sqlstate())) lease.Discard();
  } catch (...) {
  }
  if (!lease->is_open()) lease.Discard();
}

void AddMetrics(metrics::Registry& registry, const Pool& pool) {
  registry.CounterFrom("idemsaga_db_pool_waits_total",
                       "Borrows of a database connection that found none free and waited.",
                       [&pool] { return static_cast<double>(pool.waits().waits); });
  registry.CounterFrom("idemsaga_db_pool_wait_seconds_total",
                       "Time spent waiting for a free database connection.",
                       [&pool] { return pool.waits().wait_seconds; });
  registry.CounterFrom("idemsaga_db_pool_timeouts_total",
                       "Borrows that found no free database connection in time (a 503).",
                       [&pool] { return static_cast<double>(pool.waits().timeouts); });
}

}  // namespace idemsaga::common::pg
