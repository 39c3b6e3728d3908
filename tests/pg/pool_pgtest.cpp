#include <gtest/gtest.h>

#include <thread>

#include "common/pg/pool.hpp"
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

TEST(Pool, ABrokenConnectionIsReplacedNotReturned) {
  ScratchDatabase db("payment");
  Pool pool({.url = db.url(), .size = 1});
  int victim = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  {
    pqxx::connection admin(db.url());
    pqxx::nontransaction tx(admin);
    tx.exec_params("SELECT pg_terminate_backend($1)", victim);
  }
  EXPECT_ANY_THROW(pool.With([](pqxx::connection& c) {
    pqxx::work tx(c);
    tx.exec("SELECT 1");
  }));
  int replacement = pool.With([](pqxx::connection& c) { return BackendPid(c); });
  EXPECT_NE(replacement, victim);
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

TEST(Pool, AnUnreachableDatabaseIsReportedAsUnavailable) {
  Pool pool({.url = "postgresql://postgres@127.0.0.1:1/none", .size = 1});
  EXPECT_THROW(pool.Borrow(), idemsaga::common::pg::PoolUnavailable);
}

}  // namespace
