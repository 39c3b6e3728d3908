// Steps that wait (durable timers, external events) and steps that run only on a condition,
// against scripted participants and an in-memory journal: no network, no database, no real
// sleeping.
#include <gtest/gtest.h>

#include "steps/saga/runner.hpp"
#include "tests/support/saga_fakes.hpp"

namespace {

using namespace std::chrono_literals;
using idemsaga::steps::saga::Definition;
using idemsaga::steps::saga::SagaEnd;
using idemsaga::steps::saga::StepContext;
using idemsaga::steps::saga::StepRecord;
using idemsaga::steps::saga::StepResult;
using idemsaga::steps::saga::StepStatus;

long long UnixMsAgo(std::chrono::milliseconds ago) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             (std::chrono::system_clock::now() - ago).time_since_epoch())
      .count();
}

class WaitsTest : public ::testing::Test {
 protected:
  WaitsTest() { journal_.can_park = true; }

  idemsaga::steps::saga::SagaResult Run(const Definition& d,
                                        idemsaga::steps::saga::SagaInput input = {}) {
    input.parent_key = "A";
    input.tenant_id = "demo";
    input.trace_id = std::string(32, 'a');
    idemsaga::steps::saga::Runner runner(d, policy_, [this](std::chrono::milliseconds ms) {
      slept_.push_back(ms);
      if (on_sleep_) on_sleep_();
    });
    return runner.Run(input, journal_);
  }
  // The run resumed from what the last one checkpointed (as recovery resumes a parked saga).
  idemsaga::steps::saga::SagaResult Resume(const Definition& d,
                                           std::vector<StepRecord> checkpoint) {
    idemsaga::steps::saga::SagaInput input;
    input.resumed = true;
    input.checkpoint = std::move(checkpoint);
    return Run(d, input);
  }
  static const StepRecord& Step(const idemsaga::steps::saga::SagaResult& r,
                                const std::string& name) {
    return test_support::StepNamed(r.steps, name);
  }

  test_support::FakeParticipants fake_;
  test_support::FakeJournal journal_;
  idemsaga::steps::saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
  std::vector<std::chrono::milliseconds> slept_;
  std::function<void()> on_sleep_;
};

TEST_F(WaitsTest, AStepWhoseConditionFailsIsSkippedNeverCalledAndNeverCompensated) {
  Definition d("conditional");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Step("approval", fake_.Step(), fake_.Step())
      .When([](const StepContext& ctx) {
        return ctx.Input<nlohmann::json>().value("total", 0) > 1000 &&
               !ctx.Output("inventory").is_null();
      })
      .Step("payment", fake_.Step(), fake_.Step());
  fake_.Script("A-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  idemsaga::steps::saga::SagaInput small;
  small.request = {{"total", 10}};
  auto r = Run(d, small);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(Step(r, "approval").status, StepStatus::kSkipped);
  EXPECT_EQ(fake_.calls,
            (std::vector<std::string>{"A-inventory", "A-payment", "A-inventory-compensate"}));
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"inventory"}));
}

TEST_F(WaitsTest, AConditionThatHoldsRunsTheStepWithEarlierOutputsInSight) {
  Definition d("conditional");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Step("approval", fake_.Step(), fake_.Step())
      .When([](const StepContext& ctx) {
        return ctx.Output("inventory").value("inventory_id", "") == "inventory-1";
      });
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-approval"}));
  EXPECT_EQ(Step(r, "approval").status, StepStatus::kSucceeded);
}

TEST_F(WaitsTest, ACancelAfterTheLastStepThatRunsIsTooLateWhenTheRestIsSkipped) {
  Definition d("conditional");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Step("payment", fake_.Step(), fake_.Step())
      .Step("capture", fake_.Step(), fake_.Step())
      .When([](const StepContext&) { return false; });
  journal_.cancel_after_boundaries = 2;  // asked while payment, the last step that runs, ran
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
  EXPECT_EQ(Step(r, "capture").status, StepStatus::kSkipped);
}

TEST_F(WaitsTest, ACancelThatComesAsAWaitBeginsEndsItInsteadOfParking) {
  Definition d("timed");
  d.Step("inventory", fake_.Step(), fake_.Step()).Sleep("cool_off", 1h);
  journal_.cancel_after_boundaries = 2;  // not yet at the wait's boundary; by the time it parks
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(r.failed_step, "cool_off");
  EXPECT_EQ(journal_.parked_for, 0ms);  // never parked
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-inventory-compensate"}));
}

TEST_F(WaitsTest, ACancelWinsOverAConditionThatThrows) {
  Definition d("conditional");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Step("approval", fake_.Step(), fake_.Step())
      .When([](const StepContext&) -> bool { throw std::runtime_error("no such field"); });
  journal_.cancel_after_boundaries = 1;
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);  // not stuck for ever: the operator's cancel is heard
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-inventory-compensate"}));
}

TEST_F(WaitsTest, ASkippedStepStaysSkippedWhenTheSagaResumes) {
  bool asked = false;
  Definition d("conditional");
  d.Step("approval", fake_.Step(), fake_.Step()).When([&](const StepContext&) {
    asked = true;
    return true;  // would run now: a resumed saga must not ask again
  });
  StepRecord skipped;
  skipped.name = "approval";
  skipped.action_key = "A-approval";
  skipped.status = StepStatus::kSkipped;
  auto r = Resume(d, {skipped});
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_FALSE(asked);
  EXPECT_TRUE(fake_.calls.empty());
}

TEST_F(WaitsTest, AConditionThatThrowsLeavesTheSagaStuckAndRunsNothing) {
  Definition d("conditional");
  d.Step("approval", fake_.Step(), fake_.Step()).When([](const StepContext&) -> bool {
    throw std::runtime_error("no such field");
  });
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_TRUE(fake_.calls.empty());
}

TEST_F(WaitsTest, ALongTimerParksTheSagaCheckpointedAndFiresOnceWhenResumedAfterItsTime) {
  Definition d("timed");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Sleep("cool_off", 1h)
      .Step("payment", fake_.Step(), fake_.Step());
  auto first = Run(d);
  ASSERT_EQ(first.end, SagaEnd::kParked);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"park"}));
  EXPECT_GT(journal_.parked_for, 59min);
  EXPECT_LE(journal_.parked_for, 1h);
  EXPECT_EQ(Step(first, "cool_off").status, StepStatus::kWaiting);
  ASSERT_EQ(journal_.checkpoint.size(), 3u);
  EXPECT_EQ(journal_.checkpoint[1].status, StepStatus::kWaiting);
  EXPECT_EQ(journal_.checkpoint[1].action_key, "");  // it calls no participant
  EXPECT_NE(journal_.checkpoint[1].first_attempt_unix_ms, 0);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory"}));

  // Woken by recovery an hour later (the checkpoint's arrival moved back by an hour).
  auto checkpoint = journal_.checkpoint;
  checkpoint[1].first_attempt_unix_ms = UnixMsAgo(1h + 1s);
  auto second = Resume(d, checkpoint);
  EXPECT_EQ(second.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment"}));
  EXPECT_EQ(Step(second, "cool_off").status, StepStatus::kSucceeded);
  EXPECT_TRUE(Step(second, "cool_off").output.contains("woke_at_unix_ms"));
}

TEST_F(WaitsTest, ATimerCountsFromWhenTheSagaFirstReachedItNotFromTheResume) {
  Definition d("timed");
  d.Sleep("cool_off", 1h);
  StepRecord waiting;
  waiting.name = "cool_off";  // a wait has no key
  waiting.status = StepStatus::kWaiting;
  waiting.first_attempt_unix_ms = UnixMsAgo(40min);
  auto r = Resume(d, {waiting});
  EXPECT_EQ(r.end, SagaEnd::kParked);
  EXPECT_GT(journal_.parked_for, 19min);
  EXPECT_LE(journal_.parked_for, 20min);
}

TEST_F(WaitsTest, AShortTimerIsSleptAndTheSagaGoesOn) {
  Definition d("timed");
  d.Sleep("pause", 300ms).Step("payment", fake_.Step(), fake_.Step());
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_TRUE(journal_.events.empty());
  ASSERT_FALSE(slept_.empty());
  EXPECT_LE(slept_[0], 300ms);
}

TEST_F(WaitsTest, SleepUntilWakesAtTheTimeComputedFromTheInput) {
  Definition d("timed");
  d.SleepUntil(
      "until_due",
      [](const StepContext& ctx) {
        return std::chrono::system_clock::time_point(std::chrono::milliseconds(
            ctx.Input<nlohmann::json>().at("due_unix_ms").get<long long>()));
      },
      std::chrono::hours(3));
  idemsaga::steps::saga::SagaInput input;
  input.request = {{"due_unix_ms", UnixMsAgo(-2h)}};
  auto r = Run(d, input);
  EXPECT_EQ(r.end, SagaEnd::kParked);
  EXPECT_GT(journal_.parked_for, 119min);
  input.request = {{"due_unix_ms", UnixMsAgo(-5h)}};  // past its bound: it wakes at the bound
  EXPECT_EQ(Run(d, input).end, SagaEnd::kParked);
  EXPECT_LE(journal_.parked_for, 3h);
  EXPECT_GT(journal_.parked_for, 179min);
  input.request = {{"due_unix_ms", UnixMsAgo(1s)}};  // already past: no wait at all
  journal_.events.clear();
  EXPECT_EQ(Run(d, input).end, SagaEnd::kCompleted);
  EXPECT_TRUE(journal_.events.empty());
}

Definition ThreeDSecure(test_support::FakeParticipants& fake) {
  Definition d("three_d_secure");
  d.Step("inventory", fake.Step(), fake.Step())
      .Step("payment", fake.Step(), fake.Step())
      .Await("confirmation",
             {.events = {"payment_confirmed", "payment_failed"},
              .timeout = 15min,
              .decide =
                  [](const std::string& event, const nlohmann::json& payload, const StepContext&) {
                    if (event == "payment_failed") {
                      return StepResult::Terminal(402, "payment_failed",
                                                  payload.value("reason", "failed"));
                    }
                    return StepResult::Succeeded({{"confirmation_id", payload.at("id")}});
                  }})
      .Step("capture", fake.Step(), fake.Step());
  return d;
}

TEST_F(WaitsTest, AnEventWaitParksUntilTheEventThenGoesOnWithItsPayload) {
  auto d = ThreeDSecure(fake_);
  auto first = Run(d);
  ASSERT_EQ(first.end, SagaEnd::kParked);
  EXPECT_EQ(first.waiting_for, (std::vector<std::string>{"payment_confirmed", "payment_failed"}));
  EXPECT_EQ(journal_.awaited, first.waiting_for);
  EXPECT_GT(journal_.parked_for, 14min);
  EXPECT_EQ(journal_.checkpoint[2].status, StepStatus::kWaiting);

  journal_.Deliver("payment_confirmed", {{"id", "conf_1"}});
  auto second = Resume(d, journal_.checkpoint);
  EXPECT_EQ(second.end, SagaEnd::kCompleted);
  EXPECT_EQ(second.outputs["confirmation"]["confirmation_id"], "conf_1");
  // Nothing checkpointed as done is sent again; capture once.
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment", "A-capture"}));
}

TEST_F(WaitsTest, AnEventThatArrivedBeforeTheRunReachedItsWaitIsTakenWithoutParking) {
  auto d = ThreeDSecure(fake_);
  journal_.Deliver("payment_confirmed", {{"id", "early"}});
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_TRUE(journal_.events.empty());
  EXPECT_EQ(r.outputs["confirmation"]["confirmation_id"], "early");
}

TEST_F(WaitsTest, AnEventDeliveredWhileTheSagaParksIsTakenInTheSameRun) {
  auto d = ThreeDSecure(fake_);
  journal_.deliver_while_parking =
      idemsaga::steps::saga::ReceivedEvent{"payment_confirmed", {{"id", "race"}}};
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(r.outputs["confirmation"]["confirmation_id"], "race");
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory", "A-payment", "A-capture"}));
}

TEST_F(WaitsTest, AFailureEventCompensatesTheStepsBeforeInReverseAndNotTheWait) {
  auto d = ThreeDSecure(fake_);
  journal_.Deliver("payment_failed", {{"reason", "authentication failed"}});
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failed_step, "confirmation");
  EXPECT_EQ(r.failure.error_code, "payment_failed");
  EXPECT_EQ(r.failure.http_status, 402);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
  EXPECT_EQ(fake_.calls,
            (std::vector<std::string>{"A-inventory", "A-payment", "A-payment-compensate",
                                      "A-inventory-compensate"}));
}

TEST_F(WaitsTest, AWaitThatTimesOutFailsWithEventTimeoutAndCompensates) {
  auto d = ThreeDSecure(fake_);
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  auto checkpoint = journal_.checkpoint;
  checkpoint[2].first_attempt_unix_ms = UnixMsAgo(15min + 1s);  // woken at its timeout
  auto r = Resume(d, checkpoint);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "event_timeout");
  EXPECT_EQ(r.failure.http_status, 409);
  EXPECT_EQ(Step(r, "confirmation").status, StepStatus::kFailed);
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"payment", "inventory"}));
}

TEST_F(WaitsTest, AnEventStoredBeforeTheTimeoutWinsOverTheTimeout) {
  auto d = ThreeDSecure(fake_);
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  auto checkpoint = journal_.checkpoint;
  checkpoint[2].first_attempt_unix_ms = UnixMsAgo(15min + 1s);
  journal_.Deliver("payment_confirmed", {{"id", "just_in_time"}});
  EXPECT_EQ(Resume(d, checkpoint).end, SagaEnd::kCompleted);
}

TEST_F(WaitsTest, AJournalThatCannotParkIsPolledForTheEvent) {
  journal_.can_park = false;
  auto d = ThreeDSecure(fake_);
  on_sleep_ = [this] {
    if (slept_.size() == 3) journal_.Deliver("payment_confirmed", {{"id", "polled"}});
  };
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(slept_.size(), 3u);
  EXPECT_EQ(slept_[0], idemsaga::steps::saga::Runner::kEventPollEvery);
}

TEST_F(WaitsTest, ACancelledWaitingSagaCompensatesWhatRanWhenItResumes) {
  auto d = ThreeDSecure(fake_);
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  journal_.cancel_after_boundaries = 0;
  auto r = Resume(d, journal_.checkpoint);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  // A resumed saga cannot know whether an owner after the checkpoint got past the wait and
  // sent the capture: that is undone too (a tombstone if it never came). The wait has nothing
  // to undo.
  EXPECT_EQ(r.compensated, (std::vector<std::string>{"capture", "payment", "inventory"}));
  EXPECT_EQ(fake_.calls,
            (std::vector<std::string>{"A-inventory", "A-payment", "A-capture-compensate",
                                      "A-payment-compensate", "A-inventory-compensate"}));
  EXPECT_EQ(Step(r, "confirmation").status, StepStatus::kNotRun);
}

TEST_F(WaitsTest, ADecisionThatIsNeitherSuccessNorFailureLeavesTheSagaStuck) {
  Definition d("odd");
  d.Await("signal", {.events = {"go"},
                     .decide = [](const std::string&, const nlohmann::json&, const StepContext&) {
                       return StepResult::Retryable("?");
                     }});
  journal_.Deliver("go", nullptr);
  EXPECT_EQ(Run(d).end, SagaEnd::kDeferred);
}

// The clock seam: a runner given a clock of its own (which its sleep advances) counts timers,
// event timeouts and a step's deadline on it, and never reads the system's.
TEST(WaitClock, ARunnerWithAClockOfItsOwnWaitsOnThatClockAlone) {
  auto now = std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 60));
  std::chrono::milliseconds slept{0};
  test_support::FakeParticipants fake;
  test_support::FakeJournal journal;  // cannot park: every wait is slept
  fake.Script("A-payment", {StepResult::Retryable("503")});
  Definition d("clocked");
  d.Sleep("pause", 1h)
      .Await("approval", {.events = {"ok"}, .timeout = 2h})
      .Step("payment", fake.Step(), fake.Step());
  idemsaga::steps::saga::RetryPolicy policy{.max_attempts = 1000, .park_after = 0ms};
  idemsaga::steps::saga::SagaInput input;
  input.parent_key = "A";
  idemsaga::steps::saga::Runner runner(
      d, policy,
      [&](std::chrono::milliseconds ms) {
        slept += ms;
        now += ms;
      },
      {}, nullptr, nullptr, [&] { return now; });
  auto started = std::chrono::steady_clock::now();
  auto r = runner.Run(input, journal);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  // The timer, then the wait's whole timeout: the saga fails at the wait (409 event_timeout).
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "event_timeout");
  EXPECT_GE(slept, 3h);
  EXPECT_LT(slept, 3h + 1s);
  EXPECT_EQ(test_support::StepNamed(r.steps, "pause").output["woke_at_unix_ms"],
            std::chrono::duration_cast<std::chrono::milliseconds>(
                (std::chrono::system_clock::time_point(std::chrono::hours(24 * 365 * 60)) + 1h)
                    .time_since_epoch())
                .count());
  // A step's deadline is counted on it too: retried until 10 virtual minutes have passed.
  Definition p("deadline");
  p.Step("payment", fake.Step(), fake.Step(), {.step_deadline = 10min});
  idemsaga::steps::saga::Runner deadline_runner(
      p, policy,
      [&](std::chrono::milliseconds ms) {
        slept += ms;
        now += ms;
      },
      {}, nullptr, nullptr, [&] { return now; });
  slept = 0ms;
  fake.calls.clear();
  auto f = deadline_runner.Run(input, journal);
  EXPECT_EQ(f.end, SagaEnd::kFailed);
  EXPECT_GE(slept, 9min);
  EXPECT_LT(slept, 11min);
  EXPECT_LT(fake.calls.size(), 1000U);
}

TEST(WaitDefinitions, RefuseWaitsThatCouldNotEndOrCouldMixUpTheirEvents) {
  auto noop = [](StepContext&) { return StepResult::Succeeded({}); };
  Definition d("waits");
  EXPECT_THROW(d.When([](const StepContext&) { return true; }), std::logic_error);
  EXPECT_THROW(d.Await("none", {.events = {}}), std::invalid_argument);
  EXPECT_THROW(d.Await("bad", {.events = {"Has-Dash"}}), std::invalid_argument);
  EXPECT_THROW(d.Await("twice", {.events = {"go", "go"}}), std::invalid_argument);
  EXPECT_THROW(d.Await("never", {.events = {"go"}, .timeout = 0ms}), std::invalid_argument);
  EXPECT_THROW(d.Sleep("backwards", -1ms), std::invalid_argument);
  d.Await("first", {.events = {"go"}});
  EXPECT_THROW(d.Await("second", {.events = {"stop", "go"}}), std::invalid_argument);
  EXPECT_THROW(d.Step("first", noop, noop), std::invalid_argument);
  EXPECT_EQ(d.Awaiting("go")->name, "first");
  EXPECT_EQ(d.Awaiting("stop"), nullptr);
}

TEST(WaitDefinitions, WaitsCountTowardsTheLongestRunParticipantsMustKeepKeysFor) {
  auto noop = [](StepContext&) { return StepResult::Succeeded({}); };
  idemsaga::steps::saga::RetryPolicy policy{.step_deadline = 2min};
  Definition d("waits");
  d.Step("a", noop, noop)
      .Sleep("pause", 1h)
      .Await("approval", {.events = {"ok"}, .timeout = 3h})
      .SleepUntil(
          "until", [](const StepContext& ctx) { return ctx.arrived_at; }, 30min);
  EXPECT_EQ(idemsaga::steps::saga::LongestRun(policy, d), 2min + 1h + 3h + 30min);
}

}  // namespace
