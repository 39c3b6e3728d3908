#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <thread>

#include "common/pg/errors.hpp"
#include "common/pg/pool.hpp"
#include "common/pg/url.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::common::pg::Pool;
using test_support::ScratchDatabase;

int BackendPid(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  return tx.exec("SELECT pg_backend_pid()")[0][0].as<int>();
}

TEST(Pool, ReusesAReturnedConnection) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  int first = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  int second = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  EXPECT_EQ(first, second);
}

TEST(Pool, BorrowTimesOutWhenEveryConnectionIsLent) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1, .borrow_timeout = std::chrono::milliseconds(100)});
  auto held = pool.Borrow();
  EXPECT_THROW(pool.Borrow(), idemsaga::common::pg::PoolUnavailable);
}

TEST(Pool, AWaitingBorrowerGetsTheConnectionWhenItIsReturned) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1, .borrow_timeout = std::chrono::seconds(5)});
  auto held = std::make_unique<Pool::Lease>(pool.Borrow());
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held.reset();
  });
  EXPECT_NO_THROW(pool.Borrow());
  releaser.join();
}

// A failover ends every idle session (HAProxy cuts those to the old primary; a restarted
// server ends them too): the next borrower must get a live connection, not a failed request
// (a participant with no traffic during the failover answered its first request 503).
TEST(Pool, AConnectionTheServerEndedWhileIdleIsReplacedBeforeItIsLent) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  int victim = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  {
    pqxx::connection admin(db.url());
    pqxx::nontransaction tx(admin);
    tx.exec_params("SELECT pg_terminate_backend($1, 5000)", victim);
  }
  int replacement = -1;
  EXPECT_NO_THROW(replacement = pool.With([](pqxx::connection& c) {
    pqxx::work tx(c);
    return tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
  }));
  EXPECT_NE(replacement, victim);
  EXPECT_NE(replacement, -1);
}

// After a failover a connection can be left on a standby (a multi-host URL without
// target_session_attrs, or a session opened in the moment the old primary still answered):
// every write on it fails with 25006 for as long as it lives. Read-only sessions of one
// database stand in for it: ALTER DATABASE ... SET applies to sessions opened afterwards only.
TEST(Pool, AConnectionOnAReadOnlyServerIsReplacedNotReturned) {
  ScratchDatabase db("payment");
  auto set_read_only = [&](bool on) {
    pqxx::connection admin(idemsaga::common::pg::WithDatabase(db.url(), "postgres"));
    pqxx::nontransaction tx(admin);
    tx.exec(
        "ALTER DATABASE " + tx.quote_name(idemsaga::common::pg::DatabaseOf(db.url())) +
        (on ? " SET default_transaction_read_only = on" : " RESET default_transaction_read_only"));
  };
  auto write = [](pqxx::connection& c) {
    pqxx::work tx(c);
    tx.exec("CREATE TEMP TABLE IF NOT EXISTS t (i int)");
    tx.exec("INSERT INTO t VALUES (1)");
    tx.commit();
  };
  Pool pool({.url = db.url(), .size = 1});
  set_read_only(true);
  int stale = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  set_read_only(false);  // the new primary: every new session writes
  try {
    pool.With(write);
    ADD_FAILURE() << "a write on a read-only session succeeded";
  } catch (const pqxx::sql_error& e) {
    EXPECT_EQ(e.sqlstate(), "25006");
    EXPECT_EQ(idemsaga::common::pg::Classify(std::current_exception()).kind,
              idemsaga::common::pg::Failure::kUnavailable);
  }
  EXPECT_NO_THROW(pool.With(write));
  EXPECT_NE(pool.With([](pqxx::connection& c) { return BackendPid(c); }), stale);
}

// A COMMIT whose connection broke: libpqxx cannot know whether it landed (in_doubt_error,
// never a plain failure); the connection is gone and is not handed out again.
TEST(Pool, ACommitThatLostItsConnectionIsInDoubtAndTheConnectionIsReplaced) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  int victim = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  std::exception_ptr thrown;
  try {
    pool.With([&](pqxx::connection& c) {
      pqxx::work tx(c);
      tx.exec("SELECT 1");
      pqxx::connection admin(db.url());
      pqxx::nontransaction kill(admin);
      kill.exec_params("SELECT pg_terminate_backend($1)", victim);
      tx.commit();
    });
  } catch (...) {
    thrown = std::current_exception();
  }
  ASSERT_TRUE(thrown) << "the COMMIT on a terminated backend did not throw";
  EXPECT_THROW(std::rethrow_exception(thrown), pqxx::in_doubt_error);
  // What the pool threw, as every edge classifies it: an outage (503, retry), never a refusal.
  EXPECT_EQ(idemsaga::common::pg::Classify(thrown).kind,
            idemsaga::common::pg::Failure::kUnavailable);
  EXPECT_NE(pool.With([](pqxx::connection& c) { return BackendPid(c); }), victim);
}

TEST(Pool, SessionTimeoutsComeFromTheConnectionString) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  auto timeout = pool.With([](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    return tx.exec("SHOW statement_timeout")[0][0].as<std::string>();
  });
  EXPECT_EQ(timeout, "5s");
}

// A statement sent into a network partition is never answered, and the server's own timeouts
// cannot reach across it: the client's socket must give up by itself. TCP_USER_TIMEOUT ends a
// connection whose sent bytes stay unacknowledged; keepalives end one that waits for an answer
// from a peer that is gone. Read from the socket libpq opened, not from the URL.
TEST(Pool, ItsConnectionsGiveUpOnAPeerThatStoppedAnswering) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  auto option = [&](int level, int name) {
    return pool.With([&](pqxx::connection& c) {
      int value = -1;
      socklen_t len = sizeof value;
      EXPECT_EQ(getsockopt(c.sock(), level, name, &value, &len), 0);
      return value;
    });
  };
  EXPECT_EQ(option(SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(option(IPPROTO_TCP, TCP_KEEPIDLE), 5);
  EXPECT_EQ(option(IPPROTO_TCP, TCP_KEEPINTVL), 2);
  EXPECT_EQ(option(IPPROTO_TCP, TCP_KEEPCNT), 3);
  EXPECT_EQ(option(IPPROTO_TCP, TCP_USER_TIMEOUT), 10000);
}

TEST(Pool, AnUnreachableDatabaseIsReportedAsUnavailable) {
  Pool pool({.url = "postgresql://postgres@127.0.0.1:1/none", .size = 1});
  EXPECT_THROW(pool.Borrow(), idemsaga::common::pg::PoolUnavailable);
}

}  // namespace
