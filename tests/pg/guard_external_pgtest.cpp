// Guard::RunExternal and CompensateExternal: effects outside the database under a lease and a
// fencing token. The "third party" is an in-process ledger keyed by the key the effect passes
// downstream (as a card network or an e-mail provider that honours idempotency keys would be):
// calls counts every call that reached it, effects each distinct thing it did.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "steps/guard/guard.hpp"
#include "tests/support/pg_harness.hpp"

namespace {

using namespace std::chrono_literals;
using steps::guard::ActionRecord;
using steps::guard::ExternalCall;
using steps::guard::Guard;
using steps::guard::Request;
using steps::guard::Response;
using test_support::ScratchDatabase;

struct ThirdParty {
  std::mutex mutex;
  int calls = 0;
  std::map<std::string, std::string> effects;  // downstream key -> what was done
  int undos = 0;
  // Does `what` under `key` once, however often it is asked; answers what it did.
  std::string Do(const std::string& key, const std::string& what) {
    std::lock_guard lock(mutex);
    ++calls;
    return effects.emplace(key, what).first->second;
  }
};

class GuardExternalTest : public ::testing::Test {
 protected:
  GuardExternalTest()
      : db_("payment"),
        pool_({.url = db_.url(), .size = 8}),
        guard_(pool_, nullptr, {.lease = std::chrono::seconds(1)}) {}

  Request Req(std::string key, nlohmann::json body = {{"to", "ann@example.com"}}) {
    return Request{"demo", std::move(key), "POST", "/v1/emails", std::move(body)};
  }

  // Sends through the third party under the step's own key, as a careful handler does.
  Guard::ExternalEffect Send(std::string what = "sent") {
    return [this, what](const ExternalCall& call) {
      seen_.push_back({call.fencing_token, call.earlier_attempt});
      auto done = third_party_.Do(call.request.key, what);
      return Response{201, nlohmann::json{{"email", done}}.dump()};
    };
  }

  std::string Status(const std::string& key) {
    return db_.Text("SELECT status FROM idempotency_keys WHERE idempotency_key = $1", key);
  }

  ScratchDatabase db_;
  common::pg::Pool pool_;
  Guard guard_;
  ThirdParty third_party_;
  std::vector<std::pair<long long, bool>> seen_;  // (token, earlier_attempt) per call
};

TEST_F(GuardExternalTest, TheCallGoesOutOnceWithNoTransactionOpenAndItsRetryReplays) {
  long long open_transactions = -1;
  std::string status_during_call;
  auto res = guard_.RunExternal(Req("A-email"), [&](const ExternalCall& call) {
    // Seen from outside: the claim is committed, and nothing of ours holds a transaction.
    status_during_call = Status("A-email");
    open_transactions = db_.Count(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%'");
    return Send()(call);
  });
  EXPECT_EQ(res.status, 201);
  EXPECT_EQ(res.outcome, "applied");
  EXPECT_EQ(status_during_call, "pending");
  EXPECT_EQ(open_transactions, 0);
  auto again = guard_.RunExternal(Req("A-email"), Send("sent again"));
  EXPECT_EQ(again.body, res.body);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(third_party_.calls, 1);
  EXPECT_EQ(seen_, (std::vector<std::pair<long long, bool>>{{1, false}}));
  EXPECT_EQ(Status("A-email"), "completed");
  // Another request under the key is a reuse, as with any guarded effect.
  EXPECT_EQ(guard_.RunExternal(Req("A-email", {{"to", "bob@example.com"}}), Send()).status, 422);
}

TEST_F(GuardExternalTest, ADuplicateWhileTheCallIsOutGets409AndCallsNothing) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> calling;
  auto first = std::async(std::launch::async, [&] {
    return guard_.RunExternal(Req("B-email"), [&](const ExternalCall& call) {
      calling.set_value();
      released.wait();
      return Send()(call);
    });
  });
  calling.get_future().wait();
  auto duplicate = guard_.RunExternal(Req("B-email"), Send("duplicate"));
  EXPECT_EQ(duplicate.status, 409);
  EXPECT_EQ(duplicate.outcome, "in_progress");
  release.set_value();
  EXPECT_EQ(first.get().status, 201);
  EXPECT_EQ(third_party_.calls, 1);
}

// kill -9 of the holder is modelled by a call that outlives its lease: the next request takes
// the claim over (told an earlier attempt may have happened), and the holder's late answer,
// when it finally comes, is refused: it stores nothing and gets the winner's answer.
TEST_F(GuardExternalTest, AnExpiredClaimIsTakenOverAndTheZombiesLateAnswerIsRefused) {
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> calling;
  auto zombie = std::async(std::launch::async, [&] {
    return guard_.RunExternal(Req("C-email"), [&](const ExternalCall& call) {
      calling.set_value();
      released.wait();
      auto done = third_party_.Do(call.request.key, "sent by the zombie");
      return Response{201, nlohmann::json{{"email", done}, {"token", call.fencing_token}}.dump()};
    });
  });
  calling.get_future().wait();
  std::this_thread::sleep_for(1200ms);  // the lease (1 s) runs out
  auto winner = guard_.RunExternal(Req("C-email"), [&](const ExternalCall& call) {
    seen_.push_back({call.fencing_token, call.earlier_attempt});
    auto done = third_party_.Do(call.request.key, "sent by the taker");
    return Response{201, nlohmann::json{{"email", done}, {"token", call.fencing_token}}.dump()};
  });
  EXPECT_EQ(winner.status, 201);
  EXPECT_EQ(seen_, (std::vector<std::pair<long long, bool>>{{2, true}}));
  release.set_value();
  auto late = zombie.get();
  EXPECT_EQ(late.outcome, "fenced");
  EXPECT_EQ(late.body, winner.body);  // the stored answer is the winner's
  EXPECT_EQ(
      db_.Text("SELECT response_body FROM idempotency_keys WHERE idempotency_key = $1", "C-email"),
      winner.body);
  // Two calls reached the third party under one downstream key: one effect.
  EXPECT_EQ(third_party_.calls, 2);
  EXPECT_EQ(third_party_.effects.size(), 1u);
}

TEST_F(GuardExternalTest, ACallThatThrowsReleasesTheClaimAndTheRetryIsToldItMayHaveRun) {
  EXPECT_THROW(guard_.RunExternal(Req("D-email"),
                                  [&](const ExternalCall& call) -> Response {
                                    third_party_.Do(call.request.key, "sent, answer lost");
                                    throw std::runtime_error("connection reset");
                                  }),
               std::runtime_error);
  // No lease to wait out: the retry takes over at once.
  auto retry = guard_.RunExternal(Req("D-email"), Send("sent again"));
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(seen_, (std::vector<std::pair<long long, bool>>{{2, true}}));
  EXPECT_EQ(nlohmann::json::parse(retry.body)["email"], "sent, answer lost");
  EXPECT_EQ(third_party_.effects.size(), 1u);
}

TEST_F(GuardExternalTest, AnExternalUndoWaitsForItsActionRunsOnceAndRefusesALateAction) {
  auto undo = [&](const ExternalCall&, const ActionRecord& action) {
    std::lock_guard lock(third_party_.mutex);
    ++third_party_.undos;
    return nlohmann::json{{"recalled", action.body["email"]}};
  };
  // The action is still out: its compensation must wait (409), never undo half a call.
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> calling;
  auto action = std::async(std::launch::async, [&] {
    return guard_.RunExternal(Req("E-email"), [&](const ExternalCall& call) {
      calling.set_value();
      released.wait();
      return Send()(call);
    });
  });
  calling.get_future().wait();
  auto early = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                         "E-email", undo);
  EXPECT_EQ(early.status, 409);
  EXPECT_EQ(Status("E-email-compensate"), "");  // nothing stored for the refused attempt
  release.set_value();
  ASSERT_EQ(action.get().status, 201);
  auto comp = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                        "E-email", undo);
  EXPECT_EQ(comp.status, 200);
  EXPECT_EQ(nlohmann::json::parse(comp.body)["outcome"], "undone");
  auto again = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                         "E-email", undo);
  EXPECT_EQ(again.body, comp.body);
  EXPECT_EQ(third_party_.undos, 1);
  // A late retry of the undone action hears that it was compensated, not its old success.
  EXPECT_EQ(guard_.RunExternal(Req("E-email"), Send()).outcome, "compensated");
  // A compensation that arrives first leaves a tombstone: the late action is refused uncalled.
  auto first = guard_.CompensateExternal(Req("F-email-compensate", {{"action_key", "F-email"}}),
                                         "F-email", undo);
  EXPECT_EQ(nlohmann::json::parse(first.body)["outcome"], "cancelled");
  auto late = guard_.RunExternal(Req("F-email"), Send());
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(late.outcome, "cancelled");
  EXPECT_EQ(third_party_.calls, 1);
  EXPECT_EQ(third_party_.undos, 1);
}

}  // namespace
