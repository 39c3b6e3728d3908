#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <tuple>

#include "common/pg/pool.hpp"
#include "common/pg/statement.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::common::pg::Exec;
using idemsaga::common::pg::Statement;
using test_support::ScratchDatabase;

const Statement kBackendPid{"SELECT pg_backend_pid(), $1::int + 1"};

void Terminate(const std::string& url, int pid) {
  pqxx::connection admin(url);
  pqxx::nontransaction tx(admin);
  tx.exec_params("SELECT pg_terminate_backend($1)", pid);
}

// How many times the server has prepared `s` in this session (0 or 1).
int PreparedOnServer(pqxx::transaction_base& tx, const Statement& s) {
  return tx.exec_params1("SELECT count(*) FROM pg_prepared_statements WHERE name = $1", s.name())[0]
      .as<int>();
}

TEST(Statement, OneTextIsOneNameAndTwoTextsAreTwo) {
  EXPECT_EQ(Statement("SELECT 1").name(), Statement("SELECT 1").name());
  EXPECT_NE(Statement("SELECT 1").name(), Statement("SELECT 2").name());
}

TEST(Statement, IsPreparedOnceAndReused) {
  ScratchDatabase db("payment");
  pqxx::connection conn(db.url());
  pqxx::work tx(conn);
  EXPECT_EQ(Exec(tx, kBackendPid, 1)[0][1].as<int>(), 2);
  EXPECT_EQ(PreparedOnServer(tx, kBackendPid), 1);
  EXPECT_EQ(Exec(tx, kBackendPid, 41)[0][1].as<int>(), 42);
  EXPECT_EQ(PreparedOnServer(tx, kBackendPid), 1);
}

// libpqxx 6.4 reconnects a connection whose session was lost; the statement must be prepared
// again on the new session, not assumed to exist there.
TEST(Statement, SurvivesLibpqxxSilentReconnect) {
  ScratchDatabase db("payment");
  pqxx::connection conn(db.url());
  int first = [&] {
    pqxx::work tx(conn);
    int pid = Exec(tx, kBackendPid, 1)[0][0].as<int>();
    tx.commit();
    return pid;
  }();
  Terminate(db.url(), first);
  // The first use after the loss may fail (the loss is noticed there) or reconnect at once.
  int second = 0;
  for (int attempt = 0; attempt < 3 && second == 0; ++attempt) {
    try {
      pqxx::work tx(conn);
      auto row = Exec(tx, kBackendPid, 2)[0];
      EXPECT_EQ(row[1].as<int>(), 3);
      second = row[0].as<int>();
      tx.commit();
    } catch (const pqxx::broken_connection&) {
    }
  }
  EXPECT_NE(second, 0);
  EXPECT_NE(second, first);
}

TEST(Statement, AConnectionThePoolReplacesPreparesAgain) {
  ScratchDatabase db("payment");
  idemsaga::common::pg::Pool pool({.url = db.url(), .size = 1});
  auto run = [&](int n) {
    return pool.With([&](pqxx::connection& c) {
      pqxx::work tx(c);
      auto row = Exec(tx, kBackendPid, n)[0];
      tx.commit();
      return std::pair{row[0].as<int>(), row[1].as<int>()};
    });
  };
  auto [victim, two] = run(1);
  EXPECT_EQ(two, 2);
  Terminate(db.url(), victim);
  // The pool sees the closed socket before it lends the connection (or, if the server has not
  // closed it yet, the first use fails and the connection is dropped): either way the next
  // connection is a new session, which prepares the statement again.
  int replacement = 0;
  int eleven = 0;
  for (int attempt = 0; attempt < 3 && replacement == 0; ++attempt) {
    try {
      std::tie(replacement, eleven) = run(10);
    } catch (const pqxx::broken_connection&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  EXPECT_NE(replacement, victim);
  EXPECT_EQ(eleven, 11);
}

// A session whose prepared statements were dropped behind libpqxx's back fails every use;
// the pool replaces it instead of lending it out again.
TEST(Statement, AConnectionThatLostItsStatementsIsReplaced) {
  ScratchDatabase db("payment");
  idemsaga::common::pg::Pool pool({.url = db.url(), .size = 1});
  auto run = [&] {
    return pool.With([&](pqxx::connection& c) {
      pqxx::nontransaction tx(c);
      return Exec(tx, kBackendPid, 1)[0][0].as<int>();
    });
  };
  int first = run();
  pool.With([](pqxx::connection& c) {
    pqxx::nontransaction tx(c);
    tx.exec("DEALLOCATE ALL");
  });
  EXPECT_THROW(run(), pqxx::sql_error);  // 26000: prepared statement does not exist
  int second = run();
  EXPECT_NE(second, first);
}

}  // namespace
