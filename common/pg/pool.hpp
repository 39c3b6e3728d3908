// A bounded pool of libpqxx connections (libpqxx 6.4 has none).
//
// Borrow() hands a connection to one thread at a time and waits up to `borrow_timeout` for a
// free one. A lease whose user saw the connection break (or that is found closed) is dropped
// and its slot refilled by the next borrower, so a database restart heals without a process
// restart. So is one left on a standby after a failover (SQLSTATE 25006), and one whose COMMIT
// got no answer (in_doubt_error: the caller must treat the outcome as unknown, never as failed).
// One that the server (or HAProxy, at a failover) ended while it sat idle is never lent.
// What a failure met through a pool means is errors.hpp's (pg::Classify, which
// the edges in front of a pool are given). Thread-safe.
//   auto lease = pool.Borrow();
//   pqxx::work tx(*lease); ...; tx.commit();
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/metrics.hpp"
#include "common/pg/errors.hpp"
#include "common/unavailable.hpp"

namespace idemsaga::common::pg {

// No connection became free in time, or none could be opened: the database is unavailable.
class PoolUnavailable : public Unavailable {
  using Unavailable::Unavailable;
};

class Pool {
 public:
  struct Options {
    std::string url;  // session timeouts are added (see url.hpp)
    size_t size = 16;
    std::chrono::milliseconds borrow_timeout{2000};
  };

  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    pqxx::connection& operator*() const { return *conn_; }
    pqxx::connection* operator->() const { return conn_.get(); }
    // The connection is unusable (broken_connection seen): close it instead of returning it.
    void Discard() { discard_ = true; }

   private:
    friend class Pool;
    Lease(Pool* pool, std::unique_ptr<pqxx::connection> conn);
    Pool* pool_;
    std::unique_ptr<pqxx::connection> conn_;
    bool discard_ = false;
  };

  explicit Pool(Options options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Throws PoolUnavailable after `borrow_timeout`, or when a new connection cannot be opened.
  Lease Borrow();

  // Runs `fn(connection)`; a broken connection is discarded and the exception rethrown.
  template <typename Fn>
  auto With(Fn&& fn) {
    Lease lease = Borrow();
    try {
      return fn(*lease);
    } catch (...) {
      DiscardIfBroken(lease);
      throw;
    }
  }

  const std::string& url() const { return url_; }

  // For metrics: borrows that found no free connection and waited, the time they waited,
  // and those that gave up (PoolUnavailable).
  struct Waits {
    long long waits = 0;
    double wait_seconds = 0;
    long long timeouts = 0;
  };
  Waits waits() const;

 private:
  void Return(std::unique_ptr<pqxx::connection> conn, bool discard);
  static void DiscardIfBroken(Lease& lease);

  const std::string url_;
  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  size_t open_ = 0;  // idle plus borrowed
  Waits waits_;      // under mutex_
};

// Whether `pool` hands out a connection that answers a query (for a readiness probe).
bool Reachable(Pool& pool);

// Publishes `pool`'s waits: idemsaga_db_pool_waits_total, idemsaga_db_pool_wait_seconds_total,
// idemsaga_db_pool_timeouts_total. `pool` must outlive the registry's scrapes.
void AddMetrics(metrics::Registry& registry, const Pool& pool);

}  // namespace idemsaga::common::pg
