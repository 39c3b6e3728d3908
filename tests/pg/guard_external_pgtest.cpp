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
using idemsaga::steps::guard::ActionRecord;
using idemsaga::steps::guard::ExternalCall;
using idemsaga::steps::guard::Guard;
using idemsaga::steps::guard::Request;
using idemsaga::steps::guard::Response;
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

// A RunExternal whose call is out (on a thread of its own) until Release(), which returns
// what the guard then answered it.
class HeldCall {
 public:
  HeldCall(Guard& guard, Request req, Guard::ExternalEffect answer) {
    auto released = release_.get_future().share();
    auto calling = calling_.get_future();
    result_ =
        std::async(std::launch::async, [this, &guard, req = std::move(req), answer, released] {
          return guard.RunExternal(req, [&](const ExternalCall& call) {
            calling_.set_value();
            released.wait();
            return answer(call);
          });
        });
    calling.wait();
  }
  ~HeldCall() {
    if (result_.valid()) Release();
  }
  Response Release() {
    release_.set_value();
    return result_.get();
  }

 private:
  std::promise<void> release_, calling_;
  std::future<Response> result_;
};

class GuardExternalTest : public ::testing::Test {
 protected:
  GuardExternalTest() : db_("payment"), pool_({.url = db_.url(), .size = 8}), guard_(pool_) {}

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

  // What the lease's running out does, without waiting for it.
  void ExpireLease(const std::string& key) {
    db_.Exec(
        "UPDATE idempotency_keys SET lease_expires_at = now() - interval '1 second' "
        "WHERE idempotency_key = $1 AND status = 'pending'",
        key);
  }

  std::string Status(const std::string& key) {
    return db_.Text("SELECT status FROM idempotency_keys WHERE idempotency_key = $1", key);
  }

  ScratchDatabase db_;
  idemsaga::common::pg::Pool pool_;
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
  EXPECT_EQ(res.outcome, idemsaga::steps::protocol::Outcome::kApplied);
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
  HeldCall first(guard_, Req("B-email"), Send());
  auto duplicate = guard_.RunExternal(Req("B-email"), Send("duplicate"));
  EXPECT_EQ(duplicate.status, 409);
  EXPECT_EQ(duplicate.outcome, idemsaga::steps::protocol::Outcome::kInProgress);
  EXPECT_EQ(first.Release().status, 201);
  EXPECT_EQ(third_party_.calls, 1);
}

// kill -9 of the holder is modelled by a call that outlives its lease: the next request takes
// the claim over (told an earlier attempt may have happened), and the holder's late answer,
// when it finally comes, is refused: it stores nothing and gets the winner's answer.
TEST_F(GuardExternalTest, AnExpiredClaimIsTakenOverAndTheZombiesLateAnswerIsRefused) {
  HeldCall zombie(guard_, Req("C-email"), [&](const ExternalCall& call) {
    auto done = third_party_.Do(call.request.key, "sent by the zombie");
    return Response{201, nlohmann::json{{"email", done}, {"token", call.fencing_token}}.dump()};
  });
  ExpireLease("C-email");  // as if the holder had been killed
  auto winner = guard_.RunExternal(Req("C-email"), [&](const ExternalCall& call) {
    seen_.push_back({call.fencing_token, call.earlier_attempt});
    auto done = third_party_.Do(call.request.key, "sent by the taker");
    return Response{201, nlohmann::json{{"email", done}, {"token", call.fencing_token}}.dump()};
  });
  EXPECT_EQ(winner.status, 201);
  EXPECT_EQ(seen_, (std::vector<std::pair<long long, bool>>{{2, true}}));
  auto late = zombie.Release();
  EXPECT_EQ(late.outcome, idemsaga::steps::protocol::Outcome::kFenced);
  EXPECT_EQ(late.body, winner.body);  // the stored answer is the winner's
  EXPECT_EQ(
      db_.Text("SELECT response_body FROM idempotency_keys WHERE idempotency_key = $1", "C-email"),
      winner.body);
  // Two calls reached the third party under one downstream key: one effect.
  EXPECT_EQ(third_party_.calls, 2);
  EXPECT_EQ(third_party_.effects.size(), 1u);
}

// A call that throws may still be on its way to the third party: its claim is kept until the
// lease runs out, so an eager retry cannot overtake it with a second call. Only NotSent (the
// call certainly never left) frees the key at once.
TEST_F(GuardExternalTest, ACallThatThrowsKeepsItsClaimUntilTheLeaseEndsUnlessItWasNotSent) {
  EXPECT_THROW(guard_.RunExternal(Req("D-email"),
                                  [&](const ExternalCall& call) -> Response {
                                    third_party_.Do(call.request.key, "sent, answer lost");
                                    throw std::runtime_error("read timeout");
                                  }),
               std::runtime_error);
  auto eager = guard_.RunExternal(Req("D-email"), Send("sent again"));
  EXPECT_EQ(eager.status, 409);
  EXPECT_EQ(eager.outcome, idemsaga::steps::protocol::Outcome::kInProgress);
  ExpireLease("D-email");
  auto retry = guard_.RunExternal(Req("D-email"), Send("sent again"));
  EXPECT_EQ(retry.status, 201);
  EXPECT_EQ(seen_, (std::vector<std::pair<long long, bool>>{{2, true}}));
  EXPECT_EQ(nlohmann::json::parse(retry.body)["email"], "sent, answer lost");
  EXPECT_EQ(third_party_.effects.size(), 1u);

  EXPECT_THROW(guard_.RunExternal(Req("G-email"),
                                  [](const ExternalCall&) -> Response {
                                    throw idemsaga::steps::guard::NotSent("connection refused");
                                  }),
               idemsaga::steps::guard::NotSent);
  EXPECT_EQ(guard_.RunExternal(Req("G-email"), Send()).status, 201);  // at once
}

// An answer of 5xx is an outage, not an answer to replay for ever.
TEST_F(GuardExternalTest, AFiveHundredFromTheEffectIsNotStored) {
  EXPECT_THROW(guard_.RunExternal(Req("I-email"),
                                  [](const ExternalCall&) {
                                    return Response{502, R"({"error":"provider down"})"};
                                  }),
               std::runtime_error);
  EXPECT_EQ(Status("I-email"), "pending");
  ExpireLease("I-email");
  EXPECT_EQ(guard_.RunExternal(Req("I-email"), Send()).status, 201);
}

// The token, not the status, fences: a holder whose lease ran out answers while the request
// that took over is still calling. Its answer is refused and its failure frees nothing.
TEST_F(GuardExternalTest, AZombieThatAnswersWhileTheTakerIsStillCallingIsFencedByTheToken) {
  auto token = [](const ExternalCall& call) {
    return Response{201, nlohmann::json{{"token", call.fencing_token}}.dump()};
  };
  HeldCall zombie(guard_, Req("J-email"), token);
  ExpireLease("J-email");
  HeldCall taker(guard_, Req("J-email"), token);
  auto late = zombie.Release();
  EXPECT_EQ(late.outcome, idemsaga::steps::protocol::Outcome::kFenced);
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(Status("J-email"), "pending");
  EXPECT_EQ(
      db_.Count("SELECT fencing_token FROM idempotency_keys WHERE idempotency_key = $1", "J-email"),
      2);
  // Nor did its answer end the taker's claim.
  EXPECT_EQ(db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1 AND "
                      "lease_expires_at > now()",
                      "J-email"),
            1);
  auto won = taker.Release();
  EXPECT_EQ(won.status, 201);
  EXPECT_EQ(nlohmann::json::parse(won.body)["token"], 2);
}

TEST_F(GuardExternalTest, AnExternalUndoWaitsForItsActionRunsOnceAndRefusesALateAction) {
  auto undo = [&](const ExternalCall&, const ActionRecord& action) {
    std::lock_guard lock(third_party_.mutex);
    ++third_party_.undos;
    return nlohmann::json{{"recalled", action.body["email"]}};
  };
  // The action is still out: its compensation must wait (409), never undo half a call.
  HeldCall action(guard_, Req("E-email"), Send());
  auto early = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                         "E-email", undo);
  EXPECT_EQ(early.status, 409);
  EXPECT_EQ(Status("E-email-compensate"), "");  // nothing stored for the refused attempt
  ASSERT_EQ(action.Release().status, 201);
  auto comp = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                        "E-email", undo);
  EXPECT_EQ(comp.status, 200);
  EXPECT_EQ(nlohmann::json::parse(comp.body)["outcome"], "undone");
  auto again = guard_.CompensateExternal(Req("E-email-compensate", {{"action_key", "E-email"}}),
                                         "E-email", undo);
  EXPECT_EQ(again.body, comp.body);
  EXPECT_EQ(third_party_.undos, 1);
  // A late retry of the undone action hears that it was compensated, not its old success.
  EXPECT_EQ(guard_.RunExternal(Req("E-email"), Send()).outcome,
            idemsaga::steps::protocol::Outcome::kCompensated);
  // A compensation that arrives first leaves a tombstone: the late action is refused uncalled.
  auto first = guard_.CompensateExternal(Req("F-email-compensate", {{"action_key", "F-email"}}),
                                         "F-email", undo);
  EXPECT_EQ(nlohmann::json::parse(first.body)["outcome"], "cancelled");
  auto late = guard_.RunExternal(Req("F-email"), Send());
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(late.outcome, idemsaga::steps::protocol::Outcome::kCancelled);
  EXPECT_EQ(third_party_.calls, 1);
  EXPECT_EQ(third_party_.undos, 1);
}

// An action whose holder died mid-call is never retried once its saga compensates: the
// compensation cuts it off (its lease has run out), undoes it not knowing its outcome, and the
// holder's late answer is refused.
TEST_F(GuardExternalTest, ACompensationCutsOffAnActionWhoseHolderDiedMidCall) {
  std::vector<ActionRecord> undone;
  auto undo = [&](const ExternalCall&, const ActionRecord& action) {
    undone.push_back(action);
    return nlohmann::json{{"recalled_by_key", action.key}};
  };
  HeldCall dead(guard_, Req("K-email"), Send());
  auto live = guard_.CompensateExternal(Req("K-email-compensate", {{"action_key", "K-email"}}),
                                        "K-email", undo);
  EXPECT_EQ(live.status, 409);  // its lease is live: it may still answer
  ExpireLease("K-email");
  auto comp = guard_.CompensateExternal(Req("K-email-compensate", {{"action_key", "K-email"}}),
                                        "K-email", undo);
  EXPECT_EQ(comp.status, 200);
  ASSERT_EQ(undone.size(), 1u);
  EXPECT_EQ(undone[0].status, 0);  // outcome unknown
  EXPECT_EQ(undone[0].key, "K-email");
  EXPECT_EQ(dead.Release().outcome, idemsaga::steps::protocol::Outcome::kFenced);
  EXPECT_EQ(guard_.RunExternal(Req("K-email"), Send()).outcome,
            idemsaga::steps::protocol::Outcome::kCompensated);
  EXPECT_EQ(third_party_.calls, 1);  // only the dead holder's call
}

}  // namespace
