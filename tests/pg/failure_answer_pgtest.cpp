// How an edge answers a failure of the database, by SQLSTATE class, with errors raised by a
// real PostgreSQL behind a real idemsaga::common::http::Server: only an outage that a retry can
// cure is a 503 with Retry-After; a value the database refused is a 500 that never invites the
// retry.
#include <gtest/gtest.h>

#include <thread>

#include "common/http/server.hpp"
#include "common/pg/errors.hpp"
#include "common/pg/pool.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using idemsaga::common::pg::Failure;

class FailureAnswer : public ::testing::Test {
 protected:
  FailureAnswer() : db_("payment"), pool_({.url = db_.url(), .size = 2}) {
    // Raises the SQLSTATE named in the path, as PL/pgSQL code would.
    server_.Get(R"(/raise/([0-9A-Z]{5}))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  pool_.With([&](pqxx::connection& conn) {
                    pqxx::work tx(conn);
                    tx.exec_params("SELECT raise_sqlstate($1)", req.matches[1].str());
                  });
                  res.set_content("{}", "application/json");
                });
    // Real failures, not raised by hand.
    server_.Get("/nul-in-jsonb", [this](const httplib::Request&, httplib::Response& res) {
      pool_.With([&](pqxx::connection& conn) {
        pqxx::work tx(conn);
        tx.exec_params("SELECT $1::jsonb", std::string(R"({"reason":"nul\u0000inside"})"));
      });
      res.set_content("{}", "application/json");
    });
    server_.Get("/invalid-utf8", [this](const httplib::Request&, httplib::Response& res) {
      pool_.With([&](pqxx::connection& conn) {
        pqxx::work tx(conn);
        tx.exec_params("SELECT $1::text", std::string("\xc3\x28"));
      });
      res.set_content("{}", "application/json");
    });
    server_.Get("/index-row-too-large", [this](const httplib::Request&, httplib::Response& res) {
      pool_.With([&](pqxx::connection& conn) {
        pqxx::work tx(conn);
        tx.exec("CREATE TEMP TABLE wide (k text PRIMARY KEY)");
        tx.exec(
            "INSERT INTO wide SELECT string_agg(md5(i::text), '') "
            "FROM generate_series(1, 400) i");
      });
      res.set_content("{}", "application/json");
    });
    server_.Get("/terminated", [this](const httplib::Request&, httplib::Response& res) {
      auto lease = pool_.Borrow();
      try {
        pqxx::nontransaction tx(*lease);
        tx.exec("SELECT pg_terminate_backend(pg_backend_pid())");
      } catch (...) {
        lease.Discard();
        throw;
      }
      res.set_content("{}", "application/json");
    });
    db_.Exec(R"sql(CREATE FUNCTION raise_sqlstate(code text) RETURNS void LANGUAGE plpgsql AS
      $$ BEGIN RAISE EXCEPTION 'raised %', code USING ERRCODE = code; END $$)sql");
    port_ = server_.Bind("127.0.0.1", 0);
    thread_ = std::thread([this] { server_.Serve(); });
  }
  ~FailureAnswer() override {
    server_.Stop();
    thread_.join();
  }

  httplib::Result Get(const std::string& path) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10);
    return c.Get(path.c_str());
  }

  test_support::ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
  idemsaga::common::http::Server server_{{}, idemsaga::common::pg::Classify};
  int port_ = 0;
  std::thread thread_;
};

void ExpectOutage(const httplib::Result& r, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, 503) << what << ": " << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1") << what;
  EXPECT_NE(r->body.find("retrying with the same key is safe"), std::string::npos) << what;
}

void ExpectNoRetryInvited(const httplib::Result& r, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, 500) << what << ": " << r->body;
  EXPECT_FALSE(r->has_header("Retry-After")) << what;
  EXPECT_EQ(r->body.find("safe"), std::string::npos) << what << ": " << r->body;
  EXPECT_NE(r->body.find("fails the same way"), std::string::npos) << what << ": " << r->body;
}

TEST_F(FailureAnswer, ConnectionAndAvailabilityClassesAreA503WithRetryAfter) {
  for (const char* code : {"08006", "08001", "57P01", "57P02", "57P03", "53300", "53100", "40001",
                           "40P01", "55P03", "57014", "25006", "58030"}) {
    ExpectOutage(Get(std::string("/raise/") + code), code);
  }
}

TEST_F(FailureAnswer, DataExceptionsConstraintsAndLimitsAreA500ThatInvitesNoRetry) {
  for (const char* code : {"22P05", "22021", "22001", "22003", "23505", "23514", "54000"}) {
    ExpectNoRetryInvited(Get(std::string("/raise/") + code), code);
  }
}

TEST_F(FailureAnswer, ARealUnstorableValueIsNotAnOutage) {
  ExpectNoRetryInvited(Get("/nul-in-jsonb"), "a NUL in jsonb");
  ExpectNoRetryInvited(Get("/invalid-utf8"), "invalid UTF-8 in text");
  ExpectNoRetryInvited(Get("/index-row-too-large"), "an index row over the limit");
}

TEST_F(FailureAnswer, AConnectionTheServerEndedIsAnOutageAndThePoolHeals) {
  ExpectOutage(Get("/terminated"), "the backend terminated");
  auto r = Get("/raise/22P05");  // the pool hands out a working connection again
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
}

TEST_F(FailureAnswer, OtherErrorsAreA500) {
  auto r = Get("/raise/42P01");  // an undefined table: a deployment or code defect
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_FALSE(r->has_header("Retry-After"));
}

TEST(ClassifySqlState, FollowsTheSqlStateClasses) {
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("08003"), Failure::kUnavailable);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("57P01"), Failure::kUnavailable);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("57000"), Failure::kDefect);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("22P02"), Failure::kRejectedValue);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("23503"), Failure::kRejectedValue);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState("XX000"), Failure::kDefect);
  EXPECT_EQ(idemsaga::common::pg::ClassifySqlState(""), Failure::kDefect);
}

TEST(Classify, StoreOutagesOfAnyKindAreUnavailable) {
  EXPECT_EQ(idemsaga::common::pg::Classify(
                std::make_exception_ptr(idemsaga::common::pg::PoolUnavailable("x")))
                .kind,
            Failure::kUnavailable);
  EXPECT_EQ(idemsaga::common::pg::Classify(
                std::make_exception_ptr(idemsaga::common::Unavailable("redis")))
                .kind,
            Failure::kUnavailable);
  EXPECT_EQ(
      idemsaga::common::pg::Classify(std::make_exception_ptr(pqxx::in_doubt_error("commit?"))).kind,
      Failure::kUnavailable);
  EXPECT_EQ(idemsaga::common::pg::Classify(std::make_exception_ptr(std::runtime_error("bug"))).kind,
            Failure::kDefect);
}

}  // namespace

// No global state decides an answer: a process with a Pool answers a PostgreSQL outage as one
// only where it gave an edge PostgreSQL's classifier, not because a Pool exists.
TEST_F(FailureAnswer, AnEdgeAnswersByTheClassifierItWasGivenNotByThePoolsInTheProcess) {
  auto outage = std::make_exception_ptr(pqxx::broken_connection("gone"));
  httplib::Response plain, pg;
  EXPECT_EQ(idemsaga::common::http::SetFailure(plain, outage, idemsaga::common::ClassifyPlain).kind,
            Failure::kDefect);
  EXPECT_EQ(plain.status, 500);
  EXPECT_EQ(idemsaga::common::http::SetFailure(pg, outage, idemsaga::common::pg::Classify).kind,
            Failure::kUnavailable);
  EXPECT_EQ(pg.status, 503);
  EXPECT_EQ(pg.get_header_value("Retry-After"), "1");

  idemsaga::common::http::Server unconfigured;  // built after pool_: it still answers plainly
  unconfigured.Get("/broken", [](const httplib::Request&, httplib::Response&) {
    throw pqxx::broken_connection("gone");
  });
  int port = unconfigured.Bind("127.0.0.1", 0);
  std::thread serving([&] { unconfigured.Serve(); });
  httplib::Client c("127.0.0.1", port);
  auto r = c.Get("/broken");
  unconfigured.Stop();
  serving.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  EXPECT_FALSE(r->has_header("Retry-After"));
}
