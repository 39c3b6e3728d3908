// The saga runner against scripted steps and an in-memory journal: no network, no database,
// no real sleeping.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

#include "orchestrator/saga/response.hpp"
#include "orchestrator/saga/runner.hpp"

namespace {

using saga::Definition;
using saga::Outcome;
using saga::SagaEnd;
using saga::StepContext;
using saga::StepResult;

// A participant double: answers each derived key from a script and logs every call.
class FakeParticipants {
 public:
  // Answers for `key`, in order; the last one repeats.
  void Script(const std::string& key, std::vector<StepResult> answers) {
    scripts_[key] = std::deque<StepResult>(answers.begin(), answers.end());
  }
  saga::StepFn Step() {
    return [this](StepContext& ctx) {
      calls.push_back(ctx.derived_key);
      auto it = scripts_.find(ctx.derived_key);
      if (it == scripts_.end()) {
        return StepResult::Succeeded({{ctx.step_name + "_id", ctx.step_name + "-1"}});
      }
      StepResult r = it->second.front();
      if (it->second.size() > 1) it->second.pop_front();
      return r;
    };
  }
  std::vector<std::string> calls;

 private:
  std::map<std::string, std::deque<StepResult>> scripts_;
};

class FakeJournal : public saga::Journal {
 public:
  bool KeepLease() override {
    ++lease_checks;
    return lease_checks <= lose_lease_after;
  }
  bool BeginCompensation(const std::vector<saga::StepRecord>& steps, const StepResult&,
                         const std::string& failed_step) override {
    events.push_back("begin_compensation:" + failed_step);
    compensating_steps = steps;
    return allow_begin;
  }
  bool DeferStuck(const std::vector<saga::StepRecord>& steps,
                  std::chrono::milliseconds retry_in) override {
    events.push_back("stuck");
    deferred_for = retry_in;
    compensating_steps = steps;
    return true;
  }
  std::chrono::milliseconds deferred_for{0};
  int lease_checks = 0;
  int lose_lease_after = 1 << 30;
  bool allow_begin = true;
  std::vector<std::string> events;
  std::vector<saga::StepRecord> compensating_steps;
};

class RunnerTest : public ::testing::Test {
 protected:
  Definition Saga(std::vector<std::string> names) {
    Definition d("test_saga");
    for (const auto& n : names) d.Step(n, fake_.Step(), fake_.Step());
    return d;
  }
  saga::SagaResult Run(const Definition& d, saga::SagaInput input = {}) {
    if (input.parent_key.empty()) input.parent_key = "A";
    input.tenant_id = "demo";
    input.trace_id = std::string(32, 'a');
    saga::Runner runner(d, policy_, [this](std::chrono::milliseconds ms) { slept_.push_back(ms); });
    return runner.Run(input, journal_);
  }
  FakeParticipants fake_;
  FakeJournal journal_;
  saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
  std::vector<std::chrono::milliseconds> slept_;
};

TEST_F(RunnerTest, RunsEveryActionInOrderWithDerivedKeysAndCompensatesNothingOnSuccess) {
  auto def = Saga({"inventory", "payment"});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
  EXPECT_TRUE(journal_.events.empty());
  EXPECT_EQ(r.outputs["payment"]["payment_id"], "payment-1");
}

TEST_F(RunnerTest, CompensatesCompletedStepsInReverseWhenALaterStepIsDeclined) {
  auto def = Saga({"inventory", "shipping", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls,
            (std::vector<std::string>{"A-inventory", "A-shipping", "A-payment",
                                      "A-shipping-compensate", "A-inventory-compensate"}));
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"shipping", "inventory"}));
  EXPECT_EQ(r.failed_step, "payment");
  EXPECT_EQ(r.failure.error_code, "card_declined");
}

TEST_F(RunnerTest, CommitsTheDecisionToCompensateBeforeAnyCompensationIsSent) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  journal_.allow_begin = false;  // fenced at that moment: nothing may be compensated
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFenced);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"begin_compensation:payment"}));
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
  ASSERT_EQ(journal_.compensating_steps.size(), 2u);
  EXPECT_EQ(journal_.compensating_steps[0].status, "compensating");
  EXPECT_EQ(journal_.compensating_steps[1].status, "failed");
}

TEST_F(RunnerTest, AnInDoubtStepIsRetriedWithTheSameKeyThenCompensatedIfItNeverSettles) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::InDoubt("read timeout")});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  std::vector<std::string> expected = {"A-inventory",
                                       "A-payment",
                                       "A-payment",
                                       "A-payment",
                                       "A-payment",
                                       "A-payment-compensate",
                                       "A-inventory-compensate"};
  EXPECT_EQ(fake_.calls, expected);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
  EXPECT_EQ(r.steps[1].attempts, 4);
}

TEST_F(RunnerTest, AnInDoubtStepThatSettlesOnRetryCompletesTheSaga) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::InDoubt("dropped"), StepResult::Retryable("503"),
                             StepResult::Succeeded({{"charge_id", "ch_1"}}, true)});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(r.steps[1].attempts, 3);
  EXPECT_TRUE(r.steps[1].replayed);
  EXPECT_EQ(slept_.size(), 2u);
}

TEST_F(RunnerTest, RetriesExhaustedOnATransientFailureCompensateThatStepToo) {
  // A 5xx or a busy 409 may hide a request that commits later: its compensation leaves a
  // tombstone so that it can never apply.
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Retryable("HTTP 503", 503)});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
  auto response = saga::BuildResponse(r, {"ord_1", "A", std::string(32, 'a')});
  EXPECT_EQ(response.status, 503);
  EXPECT_EQ(nlohmann::json::parse(response.body)["error"]["code"], "payment_unavailable");
}

TEST_F(RunnerTest, ACompensationFailingFiveTimesIsRetriedUntilItSucceeds) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  fake_.Script(
      "A-inventory-compensate",
      {StepResult::Retryable("503"), StepResult::InDoubt("timeout"), StepResult::Retryable("503"),
       StepResult::Retryable("refused"), StepResult::Retryable("503"), StepResult::Succeeded({})});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.steps[0].compensation_attempts, 6);
  EXPECT_EQ(r.steps[0].status, "compensated");
  EXPECT_EQ(std::count(fake_.calls.begin(), fake_.calls.end(), "A-inventory-compensate"), 6);
  EXPECT_EQ(std::count(journal_.events.begin(), journal_.events.end(), "stuck"), 0);
}

TEST_F(RunnerTest, ACompensationThatKeepsFailingIsMarkedStuckAndDeferredNotDropped) {
  policy_.compensation_stuck_after = 3;
  policy_.stuck_retry_interval = std::chrono::milliseconds(5000);
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  fake_.Script("A-inventory-compensate", {StepResult::Retryable("503")});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(std::count(journal_.events.begin(), journal_.events.end(), "stuck"), 1);
  EXPECT_EQ(journal_.deferred_for, std::chrono::milliseconds(5000));
  EXPECT_EQ(r.steps[0].compensation_attempts, 3);
  EXPECT_EQ(journal_.compensating_steps[0].status, "compensating");  // still owed

  // Recovery resumes it later from what was recorded; each resume makes one attempt.
  saga::SagaInput resumed;
  resumed.parent_key = "A";
  resumed.compensating = journal_.compensating_steps;
  resumed.failure = r.failure;
  resumed.failed_step = "payment";
  fake_.Script("A-inventory-compensate", {StepResult::Succeeded({})});
  auto again = Run(def, resumed);
  EXPECT_EQ(again.end, SagaEnd::kFailed);
  EXPECT_EQ(again.steps[0].compensation_attempts, 4);
  EXPECT_EQ(again.compensated, (std::vector<std::string>{"inventory"}));
}

TEST_F(RunnerTest, ARunnerThatLostItsLeaseStopsWithoutCallingAnotherStep) {
  auto def = Saga({"inventory", "payment"});
  journal_.lose_lease_after = 1;
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFenced);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory"}));
}

TEST_F(RunnerTest, ResumingACompensatingSagaOnlyCompensatesWhatWasRecorded) {
  auto def = Saga({"inventory", "payment"});
  saga::SagaInput input;
  input.parent_key = "B";
  std::vector<saga::StepRecord> steps(2);
  steps[0] = {.name = "inventory", .action_key = "B-inventory", .status = "compensating"};
  steps[1] = {.name = "payment", .action_key = "B-payment", .status = "failed"};
  input.compensating = steps;
  input.failure = StepResult::Terminal(402, "card_declined", "declined");
  input.failed_step = "payment";
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"B-inventory-compensate"}));
  EXPECT_TRUE(journal_.events.empty());  // the decision was already durable
  EXPECT_EQ(saga::BuildResponse(r, {"ord", "B", std::string(32, 'a')}).status, 402);
}

TEST_F(RunnerTest, AStepThatThrowsIsTreatedAsInDoubt) {
  Definition def("throwing");
  def.Step(
      "inventory", [](StepContext&) -> StepResult { throw std::runtime_error("boom"); },
      fake_.Step());
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.steps[0].attempts, 4);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"inventory"}));
}

TEST_F(RunnerTest, BackoffUsesFullJitterWithinTheCap) {
  policy_.max_attempts = 8;
  policy_.initial_backoff = std::chrono::milliseconds(50);
  policy_.max_backoff = std::chrono::milliseconds(400);
  auto def = Saga({"inventory"});
  fake_.Script("A-inventory", {StepResult::Retryable("503")});
  auto r = Run(def);
  (void)r;
  ASSERT_EQ(slept_.size(), 7u);
  for (size_t i = 0; i < slept_.size(); ++i) {
    long long cap = std::min<long long>(400, 50LL << (i + 1));
    EXPECT_GE(slept_[i].count(), 0);
    EXPECT_LE(slept_[i].count(), cap);
  }
}

TEST(Definition, RejectsDuplicateAndMalformedStepNames) {
  auto noop = [](StepContext&) { return StepResult::Succeeded({}); };
  Definition d("place_order");
  d.Step("inventory", noop, noop);
  EXPECT_THROW(d.Step("inventory", noop, noop), std::invalid_argument);
  for (const char* bad :
       {"", "Inventory", "in-ventory", "compensate", "a b", "abcdefghijklmnopqrstuvwxyz0123456"}) {
    EXPECT_THROW(d.Step(bad, noop, noop), std::invalid_argument) << bad;
  }
  EXPECT_THROW(d.Step("payment", nullptr, noop), std::invalid_argument);
  EXPECT_EQ(d.steps().size(), 1u);
}

TEST(DerivedKeys, AreSuffixesOfTheParentKey) {
  EXPECT_EQ(saga::ActionKey("A", "inventory"), "A-inventory");
  EXPECT_EQ(saga::CompensationKey("A", "inventory"), "A-inventory-compensate");
}

TEST(DerivedKeys, NeverCollideAcrossParentsStepsOrActionAndCompensation) {
  // Parents that themselves look like derived keys are the dangerous ones.
  std::vector<std::string> parents = {
      "A",   "A-inventory", "A-inventory-compensate", "A-payment",   "A-", "-",
      "A-B", "inventory",   "x-compensate",           "A--inventory"};
  std::vector<std::string> names = {"inventory", "payment", "shipping", "a", "b_c", "compensate2"};
  std::map<std::string, std::string> seen;
  for (const auto& p : parents) {
    for (const auto& n : names) {
      ASSERT_TRUE(saga::IsValidStepName(n));
      for (const auto& [kind, key] : {std::pair{"action", saga::ActionKey(p, n)},
                                      std::pair{"compensation", saga::CompensationKey(p, n)}}) {
        std::string who = std::string(kind) + " of " + p + "/" + n;
        auto [it, inserted] = seen.emplace(key, who);
        EXPECT_TRUE(inserted) << key << " derived by both " << it->second << " and " << who;
      }
    }
  }
}

TEST(Response, ACompletedSagaAnswers201WithEveryStepsIds) {
  saga::SagaResult r;
  r.end = SagaEnd::kCompleted;
  r.outputs = {{"inventory", {{"reservation_id", "res_1"}, {"items", nlohmann::json::array()}}},
               {"payment", {{"charge_id", "ch_1"}, {"status", "captured"}}}};
  auto res = saga::BuildResponse(r, {"ord_1", "K", std::string(32, 'f')});
  EXPECT_EQ(res.status, 201);
  EXPECT_EQ(nlohmann::json::parse(res.body),
            nlohmann::json::parse(R"({"status":"completed","order_id":"ord_1","idempotency_key":"K",
              "reservation_id":"res_1","charge_id":"ch_1","trace_id":")" +
                                  std::string(32, 'f') + "\"}"));
}

TEST(Response, ADeclinedSagaAnswersTheParticipantsStatusAndWhatWasCompensated) {
  saga::SagaResult r;
  r.end = SagaEnd::kFailed;
  r.failure = StepResult::Terminal(402, "card_declined", "the card was declined");
  r.failed_step = "payment";
  r.compensated = {"inventory"};
  auto res = saga::BuildResponse(r, {"ord_1", "K", std::string(32, 'f')});
  EXPECT_EQ(res.status, 402);
  auto body = nlohmann::json::parse(res.body);
  EXPECT_EQ(body["status"], "failed");
  EXPECT_EQ(body["error"]["code"], "card_declined");
  EXPECT_EQ(body["compensated"], nlohmann::json::array({"inventory"}));
}

}  // namespace
