// The saga runner against scripted steps and an in-memory journal: no network, no database,
// no real sleeping.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <set>

#include "orchestrator/response.hpp"
#include "steps/saga/definition.hpp"
#include "steps/saga/fields.hpp"
#include "steps/saga/registry.hpp"
#include "steps/saga/runner.hpp"
#include "tests/support/saga_fakes.hpp"

namespace {

using idemsaga::steps::saga::Definition;
using idemsaga::steps::saga::Outcome;
using idemsaga::steps::saga::SagaEnd;
using idemsaga::steps::saga::StepContext;
using idemsaga::steps::saga::StepResult;
using test_support::FakeJournal;
using test_support::FakeParticipants;

class RunnerTest : public ::testing::Test {
 protected:
  Definition Saga(std::vector<std::string> names) {
    Definition d("test_saga");
    for (const auto& n : names) d.Step(n, fake_.Step(), fake_.Step());
    return d;
  }
  idemsaga::steps::saga::SagaResult Run(const Definition& d,
                                        idemsaga::steps::saga::SagaInput input = {}) {
    if (input.parent_key.empty()) input.parent_key = "A";
    input.tenant_id = "demo";
    input.trace_id = std::string(32, 'a');
    idemsaga::steps::saga::Runner runner(
        d, policy_, [this](std::chrono::milliseconds ms) { slept_.push_back(ms); },
        [this] {
          return stop_after_calls_ >= 0 && fake_.calls.size() >= size_t(stop_after_calls_);
        },
        nullptr, nullptr, {}, [this](std::string_view point) { boundaries_.emplace_back(point); });
    return runner.Run(input, journal_);
  }
  int stop_after_calls_ = -1;            // shutdown once this many step calls were made
  std::vector<std::string> boundaries_;  // what the runner told its AtBoundary hook
  FakeParticipants fake_;
  FakeJournal journal_;
  idemsaga::steps::saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
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

// The fault suite kills the stock binary at these names (cmd/idemsaga/crash_points.hpp): the
// engine reports each, in order, to the hook it was given, and to no one without one.
TEST_F(RunnerTest, TellsItsBoundaryHookEachBoundaryOfARunThatCompensates) {
  auto def = Saga({"inventory", "shipping", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  Run(def);
  EXPECT_EQ(boundaries_,
            (std::vector<std::string>{"after_step_sent", "after_step_answer", "after_step_sent",
                                      "after_step_answer", "after_step_sent", "after_compensating",
                                      "between_compensations"}));
}

TEST_F(RunnerTest, ACancelStopsAtTheNextStepBoundaryAndCompensatesWhatRan) {
  auto def = Saga({"inventory", "payment", "shipping"});
  journal_.cancel_after_boundaries = 1;  // asked while inventory ran
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-inventory-compensate"}));
  EXPECT_EQ(r.failed_step, "payment");
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(r.failure.http_status, 409);
  EXPECT_EQ(r.steps[1].status, idemsaga::steps::saga::StepStatus::kNotRun);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"begin_compensation:payment"}));
}

// A resumed saga starts again from its first step, so a cancel at its first boundary cannot
// know what the earlier owner sent: every step is undone (a tombstone where nothing arrived).
TEST_F(RunnerTest, ACancelledResumedSagaCompensatesEveryStepAnEarlierOwnerMayHaveSent) {
  auto def = Saga({"inventory", "payment"});
  journal_.cancel_after_boundaries = 0;
  idemsaga::steps::saga::SagaInput input;
  input.resumed = true;
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls,
            (std::vector<std::string>{"A-payment-compensate", "A-inventory-compensate"}));
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
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
  EXPECT_EQ(journal_.compensating_steps[0].status,
            idemsaga::steps::saga::StepStatus::kCompensating);
  EXPECT_EQ(journal_.compensating_steps[1].status, idemsaga::steps::saga::StepStatus::kFailed);
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
  auto response = idemsaga::orchestrator::BuildResponse(r, {"ord_1", "A", std::string(32, 'a')});
  // Final, and says so: a 503 would invite retries of a key that only replays this.
  EXPECT_EQ(response.status, 502);
  auto body = nlohmann::json::parse(response.body);
  EXPECT_EQ(body["code"], "payment_unavailable");
  EXPECT_EQ(body["retryable"], false);
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
  EXPECT_EQ(r.steps[0].status, idemsaga::steps::saga::StepStatus::kCompensated);
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
  EXPECT_EQ(journal_.compensating_steps[0].status,
            idemsaga::steps::saga::StepStatus::kCompensating);  // still owed

  // Recovery resumes it later from what was recorded; each resume makes one attempt.
  idemsaga::steps::saga::SagaInput resumed;
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
  idemsaga::steps::saga::SagaInput input;
  input.parent_key = "B";
  std::vector<idemsaga::steps::saga::StepRecord> steps(2);
  steps[0] = {.name = "inventory",
              .action_key = "B-inventory",
              .status = idemsaga::steps::saga::StepStatus::kCompensating};
  steps[1] = {.name = "payment",
              .action_key = "B-payment",
              .status = idemsaga::steps::saga::StepStatus::kFailed};
  input.compensating = steps;
  input.failure = StepResult::Terminal(402, "card_declined", "declined");
  input.failed_step = "payment";
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"B-inventory-compensate"}));
  EXPECT_TRUE(journal_.events.empty());  // the decision was already durable
  EXPECT_EQ(idemsaga::orchestrator::BuildResponse(r, {"ord", "B", std::string(32, 'a')}).status,
            402);
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

TEST_F(RunnerTest, BackoffIsFullJitterThatDoublesPerAttemptUpToTheCap) {
  // Sleeps of attempt n are uniform on [0, min(max, initial * 2^n)]: over many sagas the mean
  // is half the cap, the spread covers it, and the cap doubles until max_backoff.
  policy_.max_attempts = 7;
  policy_.initial_backoff = std::chrono::milliseconds(100);
  policy_.max_backoff = std::chrono::milliseconds(1600);
  auto def = Saga({"inventory"});
  constexpr int kSagas = 2000;
  std::vector<std::vector<long long>> by_attempt(6);
  for (int i = 0; i < kSagas; ++i) {
    fake_.Script("A-inventory", {StepResult::Retryable("503")});
    slept_.clear();
    (void)Run(def);
    ASSERT_EQ(slept_.size(), 6u);
    for (size_t a = 0; a < slept_.size(); ++a) by_attempt[a].push_back(slept_[a].count());
  }
  for (size_t a = 0; a < by_attempt.size(); ++a) {
    long long cap = std::min<long long>(1600, 100LL << (a + 1));
    auto [lo, hi] = std::minmax_element(by_attempt[a].begin(), by_attempt[a].end());
    double mean = 0;
    for (auto v : by_attempt[a]) mean += static_cast<double>(v) / kSagas;
    EXPECT_GE(*lo, 0) << "attempt " << a + 1;
    EXPECT_LE(*hi, cap) << "attempt " << a + 1;
    // Uniform on [0, cap]: the mean's standard error is cap/sqrt(12 * 2000) ~ 0.65% of cap.
    EXPECT_NEAR(mean, cap / 2.0, cap * 0.05) << "attempt " << a + 1;
    EXPECT_LT(*lo, cap * 0.05) << "attempt " << a + 1 << ": no sleep near 0 (not full jitter)";
    EXPECT_GT(*hi, cap * 0.95) << "attempt " << a + 1 << ": no sleep near the cap";
  }
}

TEST_F(RunnerTest, TheDefaultPolicyRidesOutAParticipantOutageOfAMinute) {
  idemsaga::steps::saga::RetryPolicy defaults;
  EXPECT_GE(defaults.step_deadline, std::chrono::minutes(1));
  // The attempt count must not end retries long before the deadline: even if every sleep
  // were the full cap, the attempts last past the deadline.
  auto worst = std::chrono::milliseconds(0);
  for (int a = 1; a < defaults.max_attempts && worst < defaults.step_deadline; ++a) {
    worst +=
        std::min(defaults.max_backoff,
                 std::chrono::milliseconds(defaults.initial_backoff.count() << std::min(a, 20)));
  }
  EXPECT_GE(worst, defaults.step_deadline);
}

TEST_F(RunnerTest, AParticipantsRetryAfterIsWaitedOutBeforeTheNextAttempt) {
  policy_.max_backoff = std::chrono::milliseconds(10);
  auto def = Saga({"inventory"});
  auto busy = StepResult::Retryable("HTTP 503", 503);
  busy.retry_after = std::chrono::seconds(7);
  fake_.Script("A-inventory", {busy, StepResult::Succeeded({})});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  std::chrono::milliseconds total{0};
  for (auto s : slept_) {
    total += s;
    // Slept in slices, with the lease kept between them: a waiting saga is not an orphan.
    EXPECT_LE(s, idemsaga::steps::saga::Runner::kLeaseCheckEvery);
  }
  EXPECT_GE(total, std::chrono::seconds(7));
  EXPECT_GE(journal_.lease_checks, static_cast<int>(slept_.size()));
}

// A short lease (the chaos suite's 2 s) is asked after every third of it, not every 2 s: a
// wait sliced as coarsely as the lease lost it, and another owner started the saga over.
TEST_F(RunnerTest, AWaitIsSlicedByTheJournalsLeaseNotOnlyByTheDefault) {
  journal_.keep_lease_every = std::chrono::milliseconds(300);
  auto def = Saga({"inventory"});
  auto busy = StepResult::Retryable("HTTP 503", 503);
  busy.retry_after = std::chrono::seconds(2);
  fake_.Script("A-inventory", {busy, StepResult::Succeeded({})});
  EXPECT_EQ(Run(def).end, SagaEnd::kCompleted);
  ASSERT_FALSE(slept_.empty());
  for (auto s : slept_) EXPECT_LE(s, std::chrono::milliseconds(300));
  EXPECT_GE(journal_.lease_checks, 6);
}

TEST_F(RunnerTest, ALeaseLostDuringALongWaitStopsTheSagaBeforeAnotherCall) {
  auto def = Saga({"inventory"});
  auto busy = StepResult::Retryable("HTTP 429", 429);
  busy.retry_after = std::chrono::seconds(30);
  fake_.Script("A-inventory", {busy, StepResult::Succeeded({})});
  journal_.lose_lease_after = 3;  // a takeover while this owner waits
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kFenced);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory"}));
}

TEST_F(RunnerTest, AShutdownDuringRetriesDecidesNothingAndCompensatesNothing) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Retryable("HTTP 503", 503)});
  stop_after_calls_ = 3;  // inventory, then two payment attempts; then SIGTERM
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kAbandoned);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment", "A-payment"}));
  EXPECT_TRUE(journal_.events.empty()) << "nothing may be decided or recorded on shutdown";
}

TEST_F(RunnerTest, AStepBlockedOnAConfigurationFaultWaitsVisiblyAndCompensatesNothing) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Blocked(401, "HTTP 401 unauthorized")});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"stuck"}));
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
  EXPECT_EQ(journal_.deferred_for, policy_.stuck_retry_interval);
  // Nothing final: BuildResponse is never reached, and recovery re-drives the same keys.
  EXPECT_TRUE(r.failed_step.empty());
}

TEST_F(RunnerTest, ResumedCompensationsSeeTheOutputsOfTheStepsTheyUndo) {
  Definition def("refunds");
  std::vector<std::string> seen;
  auto refund = [&](StepContext& ctx) {
    const auto& out = (*ctx.outputs)[ctx.step_name];
    seen.push_back(ctx.step_name + ":" + (out.is_object() ? out.value("charge_id", "") : ""));
    return StepResult::Succeeded({});
  };
  def.Step("card", fake_.Step(), refund).Step("wallet", fake_.Step(), refund);
  fake_.Script("A-wallet", {StepResult::Succeeded({{"charge_id", "ch_w"}})});
  fake_.Script("A-card", {StepResult::Succeeded({{"charge_id", "ch_c"}})});
  // The first owner decided to compensate, undid "wallet", and was killed (kill -9) before
  // undoing "card": its records are what the store hands the next owner.
  idemsaga::steps::saga::SagaInput input;
  input.parent_key = "A";
  std::vector<idemsaga::steps::saga::StepRecord> steps(2);
  steps[0] = {.name = "card",
              .action_key = "A-card",
              .status = idemsaga::steps::saga::StepStatus::kCompensating,
              .action_confirmed = true,
              .output = {{"charge_id", "ch_c"}}};
  steps[1] = {.name = "wallet",
              .action_key = "A-wallet",
              .status = idemsaga::steps::saga::StepStatus::kCompensated,
              .action_confirmed = true,
              .output = {{"charge_id", "ch_w"}}};
  // Records round-trip through the store as JSON.
  for (auto& st : steps) st = idemsaga::steps::saga::StepRecord::FromJson(st.ToJson());
  input.compensating = steps;
  input.failure = StepResult::Terminal(402, "card_declined", "declined");
  input.failed_step = "shipping";
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(seen, (std::vector<std::string>{"card:ch_c"}));
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"wallet", "card"}));
}

// Stored by name: every status reads back as itself, and a record with a status this build
// does not know is refused, never guessed (resuming from a guess could undo the wrong thing).
TEST(StepRecord, StatusesRoundTripByNameAndAnUnknownOneIsRefused) {
  using idemsaga::steps::saga::StepStatus;
  for (auto status : {StepStatus::kNotRun, StepStatus::kSucceeded, StepStatus::kFailed,
                      StepStatus::kInDoubt, StepStatus::kCompensating, StepStatus::kCompensated}) {
    idemsaga::steps::saga::StepRecord r{.name = "card", .status = status};
    EXPECT_EQ(idemsaga::steps::saga::StepRecord::FromJson(r.ToJson()).status, status)
        << idemsaga::steps::saga::ToString(status);
  }
  EXPECT_EQ(idemsaga::steps::saga::StepRecord{}.ToJson()["status"], "not_run");
  EXPECT_EQ(
      idemsaga::steps::saga::StepRecord::FromJson({{"name", "card"}, {"status", "compensating"}})
          .status,
      StepStatus::kCompensating);
  EXPECT_THROW(
      idemsaga::steps::saga::StepRecord::FromJson({{"name", "card"}, {"status", "undone"}}),
      std::invalid_argument);
}

TEST_F(RunnerTest, AStepThisBuildNoLongerDefinesGoesStuckInsteadOfBeingSkipped) {
  auto def = Saga({"inventory"});  // this build dropped "payment"
  idemsaga::steps::saga::SagaInput input;
  input.parent_key = "C";
  std::vector<idemsaga::steps::saga::StepRecord> steps(2);
  steps[0] = {.name = "inventory",
              .action_key = "C-inventory",
              .status = idemsaga::steps::saga::StepStatus::kCompensating};
  steps[1] = {.name = "payment",
              .action_key = "C-payment",
              .status = idemsaga::steps::saga::StepStatus::kCompensating};
  input.compensating = steps;
  input.failed_step = "shipping";
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"stuck"}));
  // Reverse order: "payment" comes first and blocks; "inventory" is not undone past it.
  EXPECT_TRUE(fake_.calls.empty());
}

TEST_F(RunnerTest, ABlockedCompensationIsDeferredAtOnceNotRetriedInALoop) {
  auto def = Saga({"inventory", "payment"});
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  fake_.Script("A-inventory-compensate", {StepResult::Blocked(0, "no record of the action")});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(std::count(fake_.calls.begin(), fake_.calls.end(), "A-inventory-compensate"), 1);
  EXPECT_EQ(journal_.compensating_steps[0].status,
            idemsaga::steps::saga::StepStatus::kCompensating);
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
  EXPECT_EQ(idemsaga::steps::saga::ActionKey("A", "inventory"), "A-inventory");
  EXPECT_EQ(idemsaga::steps::saga::CompensationKey("A", "inventory"), "A-inventory-compensate");
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
      ASSERT_TRUE(idemsaga::steps::saga::IsValidStepName(n));
      for (const auto& [kind, key] :
           {std::pair{"action", idemsaga::steps::saga::ActionKey(p, n)},
            std::pair{"compensation", idemsaga::steps::saga::CompensationKey(p, n)}}) {
        std::string who = std::string(kind) + " of " + p + "/" + n;
        auto [it, inserted] = seen.emplace(key, who);
        EXPECT_TRUE(inserted) << key << " derived by both " << it->second << " and " << who;
      }
    }
  }
}

// Reconciliation finds a participant key's saga by this inverse: it must give back exactly the
// parent and step for every parent (any bytes, '-' and "compensate" included) and child nesting.
TEST(DerivedKeys, ParseGivesBackExactlyTheParentAndStepOfEveryDerivedKey) {
  std::mt19937 rng(31);
  const std::string alphabet = std::string("aZ09-_ .:/\x7f") + '\0' + "\xc3\xa9";
  std::vector<std::string> names = {"inventory", "payment", "a", "b_c", "compensate2", "x9"};
  int checked = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string parent(1 + rng() % 24, ' ');
    for (auto& c : parent) c = alphabet[rng() % alphabet.size()];
    if (i % 7 == 0) parent += "-compensate";
    const auto& step = names[rng() % names.size()];
    std::string key = idemsaga::steps::saga::ActionKey(parent, step);
    auto got = idemsaga::steps::saga::ParseDerivedKey(key);
    ASSERT_TRUE(got) << key;
    EXPECT_EQ(got->parent, parent);
    EXPECT_EQ(got->step, step);
    EXPECT_FALSE(got->compensation);
    got = idemsaga::steps::saga::ParseDerivedKey(
        idemsaga::steps::saga::CompensationKey(parent, step));
    ASSERT_TRUE(got) << key;
    EXPECT_EQ(got->parent, parent);
    EXPECT_EQ(got->step, step);
    EXPECT_TRUE(got->compensation);
    // A child saga's step: derived from the child's run key, itself derived from the parent.
    auto child = idemsaga::steps::saga::ParseDerivedKey(
        idemsaga::steps::saga::ActionKey(idemsaga::steps::saga::ActionKey(parent, "order"), step));
    ASSERT_TRUE(child);
    auto outer = idemsaga::steps::saga::ParseDerivedKey(child->parent);
    ASSERT_TRUE(outer);
    EXPECT_EQ(outer->parent, parent);
    EXPECT_EQ(outer->step, "order");
    ++checked;
  }
  EXPECT_EQ(checked, 5000);
  for (std::string not_derived : {"A", "-inventory", "A-", "A-Inventory", "A-compensate",
                                  "-compensate", "A-in-ventory!", "A-x-y-compensate-"}) {
    EXPECT_FALSE(idemsaga::steps::saga::ParseDerivedKey(not_derived)) << not_derived;
  }
}

TEST(Response, ACompletedSagaAnswers201WithEveryStepsIds) {
  idemsaga::steps::saga::SagaResult r;
  r.end = SagaEnd::kCompleted;
  r.outputs = {{"inventory", {{"reservation_id", "res_1"}, {"items", nlohmann::json::array()}}},
               {"payment", {{"charge_id", "ch_1"}, {"status", "captured"}}}};
  auto res = idemsaga::orchestrator::BuildResponse(r, {"ord_1", "K", std::string(32, 'f')});
  EXPECT_EQ(res.status, 201);
  EXPECT_EQ(nlohmann::json::parse(res.body),
            nlohmann::json::parse(R"({"status":"completed","order_id":"ord_1","idempotency_key":"K",
              "reservation_id":"res_1","charge_id":"ch_1","trace_id":")" +
                                  std::string(32, 'f') + "\"}"));
}

TEST(Response, ADeclinedSagaAnswersTheParticipantsStatusAndWhatWasCompensated) {
  idemsaga::steps::saga::SagaResult r;
  r.end = SagaEnd::kFailed;
  r.failure = StepResult::Terminal(402, "card_declined", "the card was declined");
  r.failed_step = "payment";
  r.compensated = {"inventory"};
  auto res = idemsaga::orchestrator::BuildResponse(r, {"ord_1", "K", std::string(32, 'f')});
  EXPECT_EQ(res.status, 402);
  EXPECT_EQ(res.content_type, "application/problem+json");
  EXPECT_EQ(idemsaga::common::http::StoredHeaders(res).at("Content-Type"),
            "application/problem+json");
  // RFC 9457: the members it defines, then ours beside them.
  EXPECT_EQ(res.body,
            R"({"code":"card_declined","compensated":["inventory"],"detail":"the card was )"
            R"(declined","idempotency_key":"K","order_id":"ord_1","retryable":false,)"
            R"("saga_status":"failed","status":402,"step":"payment","title":"Card declined",)"
            R"("trace_id":"ffffffffffffffffffffffffffffffff",)"
            R"("type":"https://idemsaga.dev/problems/card_declined"})");
}

// --- your own sagas: per-step policy, typed input, the registry, the field reader ----------

TEST_F(RunnerTest, AStepsOwnPolicyOverridesTheRunnersForThatStepOnly) {
  Definition d("test_saga");
  d.Step("inventory", fake_.Step(), fake_.Step());
  d.Step("payment", fake_.Step(), fake_.Step(), {.max_attempts = 2});
  fake_.Script("A-inventory", {StepResult::Retryable("busy"), StepResult::Retryable("busy"),
                               StepResult::Succeeded({})});
  fake_.Script("A-payment", {StepResult::Retryable("busy")});
  auto r = Run(d);
  // inventory took 3 of its 4 attempts; payment gave up after its own 2.
  EXPECT_EQ(r.steps[0].attempts, 3);
  EXPECT_EQ(r.steps[1].attempts, 2);
  EXPECT_EQ(r.failed_step, "payment");
}

struct Typed {
  std::string who;
  long long n;
};

TEST_F(RunnerTest, StepsReadTheTypedInputAndEarlierOutputs) {
  Definition d("typed");
  std::vector<std::string> seen;
  d.Input<Typed>([](const nlohmann::json& j) {
     idemsaga::steps::saga::Fields f(j);
     Typed t{f.Text("who", 8), f.Integer("n", 1, 9)};
     f.Done();
     return t;
   })
      .Step("first", fake_.Step(), fake_.Step())
      .Step(
          "second",
          [&](StepContext& ctx) {
            seen.push_back(ctx.Input<Typed>().who + std::to_string(ctx.Input<Typed>().n));
            seen.push_back(ctx.Output("first")["first_id"].get<std::string>());
            EXPECT_TRUE(ctx.Output("second").is_null());
            return StepResult::Succeeded({{"second_id", "s"}});
          },
          fake_.Step());
  idemsaga::steps::saga::SagaInput input;
  input.request = {{"who", "ada"}, {"n", 3}};
  auto r = Run(d, input);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(seen, (std::vector<std::string>{"ada3", "first-1"}));
}

TEST_F(RunnerTest, AStoredInputThatNoLongerParsesIsDeferredAndNothingRuns) {
  Definition d("typed");
  d.Input<Typed>([](const nlohmann::json&) -> Typed {
     throw idemsaga::steps::saga::InvalidInput("who is required");
   }).Step("first", fake_.Step(), fake_.Step());
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_TRUE(fake_.calls.empty());
  EXPECT_GT(journal_.deferred_for.count(), 0);
}

TEST(Registry, FindsEachVersionAndServesTheLatestToNewRequests) {
  idemsaga::steps::saga::Registry registry;
  registry.Add(Definition("ship", 1).Step(
      "a", [](StepContext&) { return StepResult::Retryable(""); },
      [](StepContext&) { return StepResult::Retryable(""); }));
  registry.Add(Definition("ship", 2));
  registry.Add(Definition("other"));
  EXPECT_EQ(registry.Latest("ship")->version(), 2);
  EXPECT_EQ(registry.Find("ship", 1)->steps().size(), 1u);
  EXPECT_EQ(registry.Find("ship", 3), nullptr);
  EXPECT_EQ(registry.Latest("none"), nullptr);
  EXPECT_EQ(registry.All().size(), 3u);
  EXPECT_EQ(registry.MaxSteps(), 1u);
  EXPECT_THROW(registry.Add(Definition("ship", 2)), std::invalid_argument);
  EXPECT_THROW(Definition("Ship"), std::invalid_argument);
  EXPECT_THROW(Definition("ship", 0), std::invalid_argument);
}

TEST(Fields, EveryBrokenRuleNamesItsField) {
  auto error = [](const nlohmann::json& j) -> std::string {
    try {
      idemsaga::steps::saga::Fields f(j);
      f.Text("name", 4);
      f.Integer("n", 1, 10);
      auto to = f.Object("to");
      to.Text("country", 2);
      to.Done();
      f.Done();
      return "";
    } catch (const idemsaga::steps::saga::InvalidInput& e) {
      return e.what();
    }
  };
  auto ok = nlohmann::json{{"name", "ada"}, {"n", 2}, {"to", {{"country", "GB"}}}};
  EXPECT_EQ(error(ok), "");
  auto with = [&](const char* field, nlohmann::json v) {
    auto j = ok;
    j[field] = std::move(v);
    return error(j);
  };
  EXPECT_EQ(error(nlohmann::json::array()), "the body must be a JSON object");
  EXPECT_EQ(with("name", ""), "name must be a string of 1-4 printable characters");
  EXPECT_EQ(with("name", "toolong"), "name must be a string of 1-4 printable characters");
  EXPECT_EQ(with("name", "a\nb"), "name must be a string of 1-4 printable characters");
  EXPECT_EQ(with("n", 2.5), "n must be an integer from 1 to 10");
  EXPECT_EQ(with("n", 1e3), "n must be an integer from 1 to 10");
  EXPECT_EQ(with("n", 18446744073709551615ull), "n must be an integer from 1 to 10");
  EXPECT_EQ(with("to", 1), "to must be an object");
  EXPECT_EQ(with("to", {{"country", "GB"}, {"city", "x"}}), "to has unknown field 'city'");
  EXPECT_EQ(with("extra", 1), "unknown field 'extra'");
  auto missing = ok;
  missing.erase("n");
  EXPECT_EQ(error(missing), "n is required");
}

TEST(Response, AStepsOwnOrderIdNeverReplacesTheOrchestrators) {
  idemsaga::steps::saga::SagaResult r;
  r.end = SagaEnd::kCompleted;
  r.outputs["loyalty"] = {{"order_id", "theirs"}, {"points_id", "pts_1"}, {"status", "x"}};
  auto res = idemsaga::orchestrator::BuildResponse(r, {"ord_1", "K", std::string(32, 'f')});
  auto body = nlohmann::json::parse(res.body);
  EXPECT_EQ(body["order_id"], "ord_1");
  EXPECT_EQ(body["status"], "completed");
  EXPECT_EQ(body["points_id"], "pts_1");
}

// Waiting costs no thread: a wait of park_after or more is not slept; the saga is
// checkpointed and parked until then, and resumes from its checkpoint.
StepResult RetryAfter(std::chrono::milliseconds wait) {
  auto r = StepResult::Retryable("HTTP 503", 503);
  r.retry_after = wait;
  return r;
}

TEST_F(RunnerTest, ALongRetryAfterParksTheSagaInsteadOfSleeping) {
  journal_.can_park = true;
  fake_.Script("A-payment", {RetryAfter(std::chrono::seconds(30))});
  auto def = Saga({"inventory", "payment"});
  auto r = Run(def);
  EXPECT_EQ(r.end, SagaEnd::kParked);
  EXPECT_TRUE(slept_.empty());  // no thread waited
  EXPECT_EQ(journal_.parked_for, std::chrono::seconds(30));
  ASSERT_EQ(journal_.checkpoint.size(), 2u);
  EXPECT_EQ(journal_.checkpoint[0].status, idemsaga::steps::saga::StepStatus::kSucceeded);
  EXPECT_EQ(journal_.checkpoint[0].output["inventory_id"], "inventory-1");
  EXPECT_EQ(journal_.checkpoint[1].attempts, 1);
  EXPECT_GT(journal_.checkpoint[1].first_attempt_unix_ms, 0);
  EXPECT_EQ(journal_.checkpoint[1].detail, "HTTP 503");
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
}

TEST_F(RunnerTest, AShortWaitIsSleptNotParked) {
  journal_.can_park = true;
  fake_.Script("A-payment",
               {RetryAfter(std::chrono::milliseconds(300)), StepResult::Succeeded({})});
  auto r = Run(Saga({"payment"}));
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_TRUE(journal_.events.empty());
  EXPECT_FALSE(slept_.empty());
}

TEST_F(RunnerTest, AWaitThatEndsWithinTheWaitingClientsBudgetIsSleptSoItStillGetsItsAnswer) {
  journal_.can_park = true;
  fake_.Script("A-payment", {RetryAfter(std::chrono::seconds(2)), StepResult::Succeeded({})});
  idemsaga::steps::saga::SagaInput input;
  input.answer_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto r = Run(Saga({"payment"}), input);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_TRUE(journal_.events.empty());
  // Past the budget it parks: the client gets its 202 then anyway.
  fake_.Script("B-payment", {RetryAfter(std::chrono::seconds(30))});
  input.parent_key = "B";
  EXPECT_EQ(Run(Saga({"payment"}), input).end, SagaEnd::kParked);
}

// A call the bulkhead turned away (busy: not sent, the participant saturated) parks even
// inside the waiting client's budget: sleeping would hold a thread for that participant.
TEST_F(RunnerTest, ACallTurnedAwayByTheBulkheadParksEvenWithinTheBudget) {
  journal_.can_park = true;
  auto busy = RetryAfter(std::chrono::seconds(1));
  busy.busy = true;
  fake_.Script("A-payment", {busy, StepResult::Succeeded({})});
  idemsaga::steps::saga::SagaInput input;
  input.answer_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto r = Run(Saga({"payment"}), input);
  EXPECT_EQ(r.end, SagaEnd::kParked);
  EXPECT_TRUE(slept_.empty());
  EXPECT_GE(journal_.parked_for, std::chrono::seconds(1));
}

TEST_F(RunnerTest, AResumedSagaSendsNoCheckpointedSuccessAgainAndGoesOnWhereItWaited) {
  journal_.can_park = true;
  fake_.Script("A-payment", {RetryAfter(std::chrono::seconds(30))});
  auto def = Saga({"inventory", "payment"});
  ASSERT_EQ(Run(def).end, SagaEnd::kParked);
  auto checkpoint = journal_.checkpoint;
  fake_.calls.clear();
  fake_.Script("A-payment", {StepResult::Succeeded({{"charge_id", "ch_1"}})});
  idemsaga::steps::saga::SagaInput input;
  input.resumed = true;
  input.checkpoint = checkpoint;
  auto r = Run(def, input);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-payment"}));  // inventory not re-sent
  EXPECT_EQ(r.outputs["inventory"]["inventory_id"], "inventory-1");
  EXPECT_EQ(r.steps[1].attempts, 2);  // the count goes on
}

TEST_F(RunnerTest, AResumedStepKeepsItsDeadlineAndItsDoubt) {
  journal_.can_park = true;
  policy_.max_attempts = 1000;
  auto def = Saga({"inventory", "payment"});
  idemsaga::steps::saga::StepRecord waited;
  waited.name = "payment";
  waited.action_key = "A-payment";
  waited.attempts = 5;
  waited.maybe_applied = true;  // an earlier attempt timed out after sending
  waited.first_attempt_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(
          (std::chrono::system_clock::now() - policy_.step_deadline - std::chrono::seconds(1))
              .time_since_epoch())
          .count();
  idemsaga::steps::saga::SagaInput input;
  input.resumed = true;
  input.checkpoint = std::vector<idemsaga::steps::saga::StepRecord>{waited};
  fake_.Script("A-payment", {RetryAfter(std::chrono::seconds(30))});
  auto r = Run(def, input);
  // Past its deadline: one more attempt, then the step is given up on, as possibly applied,
  // and both steps are compensated (the payment too: it may have been charged).
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.steps[1].attempts, 6);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
}

TEST_F(RunnerTest, ACompensationThatMustWaitParksWithItsCountKept) {
  journal_.can_park = true;
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  fake_.Script("A-inventory-compensate", {RetryAfter(std::chrono::seconds(10))});
  auto r = Run(Saga({"inventory", "payment"}));
  EXPECT_EQ(r.end, SagaEnd::kParked);
  ASSERT_EQ(journal_.checkpoint.size(), 2u);
  EXPECT_EQ(journal_.checkpoint[0].status, idemsaga::steps::saga::StepStatus::kCompensating);
  EXPECT_EQ(journal_.checkpoint[0].compensation_attempts, 1);
  EXPECT_EQ(journal_.parked_for, std::chrono::seconds(10));
}

}  // namespace
