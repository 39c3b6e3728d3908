// Child sagas (Definition::Child): a saga run as one step of another under a derived key,
// undone with its parent, parked with it. Scripted participants and an in-memory journal.
#include <gtest/gtest.h>

#include <mutex>

#include "common/trace/exporter.hpp"
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
using Calls = std::vector<std::string>;

class ChildTest : public ::testing::Test {
 protected:
  ChildTest() { journal_.can_park = true; }

  idemsaga::steps::saga::SagaResult Run(const Definition& d,
                                        idemsaga::steps::saga::SagaInput input = {}) {
    return test_support::RunAsA(d, policy_, journal_, std::move(input));
  }
  // The run resumed from the checkpoint of the last park.
  idemsaga::steps::saga::SagaResult ResumeFromPark(const Definition& d) {
    idemsaga::steps::saga::SagaInput resume;
    resume.resumed = true;
    resume.checkpoint = journal_.checkpoint;
    return Run(d, resume);
  }
  // gift: inventory, then payment, each under "<child key>-<step>".
  Definition Gift() {
    Definition gift("gift_box");
    gift.Step("inventory", fake_.Step(), fake_.Step()).Step("payment", fake_.Step(), fake_.Step());
    return gift;
  }
  // pre, the gift child, post.
  Definition Order(Definition child) {
    Definition d("order");
    d.Step("pre", fake_.Step(), fake_.Step())
        .Child("gift", std::move(child),
               [](const StepContext& ctx) {
                 return nlohmann::json{{"for", ctx.Output("pre")["pre_id"]}};
               })
        .Step("post", fake_.Step(), fake_.Step());
    return d;
  }

  test_support::FakeParticipants fake_;
  test_support::FakeJournal journal_;
  idemsaga::steps::saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
};

TEST_F(ChildTest, AChildRunsUnderItsOwnDerivedKeysAndLaterStepsSeeItsOutputs) {
  std::string seen;
  Definition d("order");
  d.Step("pre", fake_.Step(), fake_.Step())
      .Child("gift", Gift(),
             [](const StepContext& ctx) {
               return nlohmann::json{{"for", ctx.Output("pre")["pre_id"]}};
             })
      .Step(
          "post",
          [&](StepContext& ctx) {
            seen = ctx.Output("gift")["outputs"]["payment"]["payment_id"];
            return StepResult::Succeeded({});
          },
          fake_.Step());
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (Calls{"A-pre", "A-gift-inventory", "A-gift-payment"}));
  EXPECT_EQ(seen, "payment-1");
  EXPECT_EQ(r.outputs["gift"]["saga"], "gift_box");
  EXPECT_EQ(r.outputs["gift"]["request"], nlohmann::json({{"for", "pre-1"}}));
  EXPECT_EQ(test_support::StepNamed(r.steps, "gift").action_key, "");  // no call of its own
}

TEST_F(ChildTest, TheChildsTraceHangsUnderItsStepInTheParentsTrace) {
  std::mutex mu;
  std::vector<idemsaga::common::trace::SpanData> spans;
  idemsaga::common::trace::Exporter exporter(
      [&](const std::vector<idemsaga::common::trace::SpanData>& batch) {
        std::lock_guard lock(mu);
        spans.insert(spans.end(), batch.begin(), batch.end());
        return true;
      },
      {});
  idemsaga::common::trace::Tracer tracer("orchestrator", &exporter);
  idemsaga::steps::saga::SagaInput input{
      .tenant_id = "demo", .parent_key = "A", .trace_id = std::string(32, 'a')};
  Definition d = Order(Gift());
  idemsaga::steps::saga::Runner runner(d, policy_, {}, {}, &tracer);
  ASSERT_EQ(runner.Run(input, journal_).end, SagaEnd::kCompleted);
  exporter.Flush();
  std::map<std::string, idemsaga::common::trace::SpanData> by_name;
  for (const auto& s : spans) by_name[s.name] = s;
  ASSERT_TRUE(by_name.count("saga order") && by_name.count("step gift") &&
              by_name.count("saga gift_box") && by_name.count("step payment"));
  EXPECT_EQ(by_name["step gift"].parent_span_id, by_name["saga order"].span_id);
  EXPECT_EQ(by_name["saga gift_box"].parent_span_id, by_name["step gift"].span_id);
  EXPECT_EQ(by_name["step payment"].parent_span_id, by_name["saga gift_box"].span_id);
  EXPECT_EQ(std::get<std::string>(by_name["step payment"].attributes.at("idempotency_key")),
            "A-gift");
}

TEST_F(ChildTest, AFailedChildUndoesItsOwnStepsAndThenTheParentUndoesTheStepsBefore) {
  fake_.Script("A-gift-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  auto r = Run(Order(Gift()));
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failed_step, "gift");
  EXPECT_EQ(r.failure.http_status, 402);
  EXPECT_EQ(r.failure.error_code, "card_declined");
  EXPECT_EQ(r.compensated, (Calls{"pre"}));  // the child was undone by itself
  EXPECT_EQ(fake_.calls, (Calls{"A-pre", "A-gift-inventory", "A-gift-payment",
                                "A-gift-inventory-compensate", "A-pre-compensate"}));
}

// The child's decision to compensate is the parent's, committed once, before the child sends
// any compensation; a parent resumed from it (a crash mid-way) finishes the child's undoing,
// then its own.
TEST_F(ChildTest, AFailingChildsDecisionIsTheParentsMadeDurableBeforeAnyCompensation) {
  fake_.Script("A-gift-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  Definition d = Order(Gift());
  auto r = Run(d);
  ASSERT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(journal_.events, (Calls{"begin_compensation:gift"}));
  auto committed = journal_.compensating_steps;
  EXPECT_EQ(test_support::StepNamed(committed, "pre").status, StepStatus::kCompensating);
  auto gift = test_support::StepNamed(committed, "gift");
  EXPECT_EQ(gift.status, StepStatus::kCompensating);
  EXPECT_EQ(gift.output["steps"][0]["status"], "compensating");  // the child's inventory
  // Killed right there: the next owner resumes from what was committed.
  fake_.calls.clear();
  idemsaga::steps::saga::SagaInput resume;
  resume.resumed = true;
  resume.compensating = committed;
  resume.failure = r.failure;
  resume.failed_step = "gift";
  auto resumed = Run(d, resume);
  EXPECT_EQ(resumed.end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls, (Calls{"A-gift-inventory-compensate", "A-pre-compensate"}));
}

// A child that parks while it undoes itself (a compensation waiting out a Retry-After) writes
// the parent's records again: they must still say what is to be undone.
TEST_F(ChildTest, AChildParkedWhileUndoingItselfKeepsTheParentsDecisionInItsCheckpoint) {
  fake_.Script("A-gift-payment", {StepResult::Terminal(402, "card_declined", "declined")});
  StepResult busy = StepResult::Retryable("busy", 503);
  busy.retry_after = 30s;
  fake_.Script("A-gift-inventory-compensate", {busy, StepResult::Succeeded({})});
  Definition d = Order(Gift());
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  EXPECT_EQ(test_support::StepNamed(journal_.checkpoint, "pre").status, StepStatus::kCompensating);
  auto gift = test_support::StepNamed(journal_.checkpoint, "gift");
  EXPECT_EQ(gift.status, StepStatus::kCompensating);
  EXPECT_EQ(gift.output["steps"][0]["status"], "compensating");
  // Resumed (the row is compensating): the child's release, then pre's.
  fake_.calls.clear();
  idemsaga::steps::saga::SagaInput resume;
  resume.resumed = true;
  resume.compensating = journal_.checkpoint;
  resume.failed_step = "gift";
  EXPECT_EQ(Run(d, resume).end, SagaEnd::kFailed);
  EXPECT_EQ(fake_.calls, (Calls{"A-gift-inventory-compensate", "A-pre-compensate"}));
}

TEST_F(ChildTest, AChildsEventsAreItsParentsAndNoTwoStepsAwaitOneName) {
  Definition approval("approval");
  approval.Await("approve", {.events = {"approved"}, .timeout = 1h});
  Definition d("order");
  d.Child("first", approval, [](const StepContext&) { return nlohmann::json::object(); });
  ASSERT_NE(d.Awaiting("approved"), nullptr);
  EXPECT_EQ(d.Awaiting("approved")->name, "approve");
  EXPECT_EQ(d.Events(), (Calls{"approved"}));
  EXPECT_THROW(
      d.Child("second", approval, [](const StepContext&) { return nlohmann::json::object(); }),
      std::invalid_argument);
  EXPECT_THROW(d.Await("again", {.events = {"approved"}}), std::invalid_argument);
}

// A derived key must fit the participants' 255 bytes under any parent key the routes take:
// each level of nesting adds "-<child>" to every key below it.
TEST_F(ChildTest, ANestingWhoseKeysWouldNotFitIsRefusedWhenItIsDefined) {
  auto input = [](const StepContext&) { return nlohmann::json::object(); };
  const std::string longest(32, 's');
  Definition leaf("leaf");
  leaf.Step(longest, fake_.Step(), fake_.Step());
  EXPECT_EQ(leaf.LongestKeySuffix(), 1 + 32 + std::string("-compensate").size());
  Definition mid("mid");
  mid.Child("c", leaf, input);  // 2 + 44 = 46
  EXPECT_EQ(mid.LongestKeySuffix(), 46U);
  Definition top("top");
  top.Child("abcdefgh", leaf, input);                                          // 9 + 44 = 53: fits
  EXPECT_THROW(top.Child("abcdefghijk", leaf, input), std::invalid_argument);  // 56
  EXPECT_NO_THROW(top.Child("deep", mid, input));                              // 5 + 46 = 51
  EXPECT_THROW(top.Child("deeper_nest", mid, input), std::invalid_argument);   // 12 + 46 = 58
}

TEST_F(ChildTest, ACallTheChildWasRetryingWhenItParkedIsUndoneWithIt) {
  StepResult timed_out = StepResult::InDoubt("timed out");
  timed_out.retry_after = 30s;
  fake_.Script("A-gift-payment", {timed_out});
  Definition d = Order(Gift());
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  // Cancelled while parked: the resumed parent undoes the child, the payment that may have
  // been applied included.
  journal_.cancel_after_boundaries = 0;
  fake_.calls.clear();
  auto r = ResumeFromPark(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(fake_.calls, (Calls{"A-post-compensate", "A-gift-payment-compensate",
                                "A-gift-inventory-compensate", "A-pre-compensate"}));
}

TEST_F(ChildTest, CompensatingTheParentCompensatesACompletedChildInReverse) {
  fake_.Script("A-post", {StepResult::Terminal(422, "undeliverable", "no such address")});
  auto r = Run(Order(Gift()));
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.compensated, (Calls{"gift", "pre"}));
  EXPECT_EQ(
      (Calls(fake_.calls.end() - 3, fake_.calls.end())),
      (Calls{"A-gift-payment-compensate", "A-gift-inventory-compensate", "A-pre-compensate"}));
  // The child's records say what was undone.
  auto gift = test_support::StepNamed(r.steps, "gift");
  EXPECT_EQ(gift.status, StepStatus::kCompensated);
  for (const auto& s : gift.output["steps"]) EXPECT_EQ(s["status"], "compensated") << s.dump();
}

TEST_F(ChildTest, AWaitInsideTheChildParksTheParentAndAResumeGoesOnInsideTheChild) {
  StepResult busy = StepResult::Retryable("busy", 503);
  busy.retry_after = 30s;
  fake_.Script("A-gift-payment", {busy, StepResult::Succeeded({{"charge_id", "ch_1"}})});
  Definition d = Order(Gift());
  auto r = Run(d);
  ASSERT_EQ(r.end, SagaEnd::kParked);
  EXPECT_GT(journal_.parked_for, 29s);
  // The parent's checkpoint holds the child's: its inventory done, its payment tried once.
  auto gift = test_support::StepNamed(journal_.checkpoint, "gift");
  ASSERT_TRUE(gift.output.contains("steps")) << gift.output.dump();
  EXPECT_EQ(gift.output["steps"][0]["status"], "succeeded");
  EXPECT_EQ(gift.output["steps"][1]["attempts"], 1);
  fake_.calls.clear();
  auto resumed = ResumeFromPark(d);
  EXPECT_EQ(resumed.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (Calls{"A-gift-payment", "A-post"}));
  EXPECT_EQ(resumed.outputs["gift"]["outputs"]["payment"]["charge_id"], "ch_1");
}

TEST_F(ChildTest, AChildsTimerCountsFromWhenItWasFirstReachedAcrossParks) {
  Definition cool("cool_off");
  cool.Sleep("wait", 1h).Step("notify", fake_.Step(), fake_.Step());
  Definition d = Order(std::move(cool));
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  EXPECT_GT(journal_.parked_for, 59min);
  // Resumed two hours after the timer was first reached: it has fired.
  auto checkpoint = journal_.checkpoint;
  for (auto& s : checkpoint) {
    if (s.name != "gift") continue;
    s.output["steps"][0]["first_attempt_unix_ms"] =
        std::chrono::duration_cast<std::chrono::milliseconds>(
            (std::chrono::system_clock::now() - 2h).time_since_epoch())
            .count();
  }
  fake_.calls.clear();
  idemsaga::steps::saga::SagaInput resume;
  resume.resumed = true;
  resume.checkpoint = checkpoint;
  EXPECT_EQ(Run(d, resume).end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (Calls{"A-gift-notify", "A-post"}));
}

TEST_F(ChildTest, AnEventTheChildAwaitsIsAwaitedByTheParentsRun) {
  Definition approval("approval");
  approval.Await("approve", {.events = {"approved"}, .timeout = 1h})
      .Step("notify", fake_.Step(), fake_.Step());
  Definition d = Order(std::move(approval));
  auto r = Run(d);
  ASSERT_EQ(r.end, SagaEnd::kParked);
  EXPECT_EQ(r.waiting_for, (Calls{"approved"}));
  journal_.Deliver("approved", {{"by", "ada"}});
  EXPECT_EQ(ResumeFromPark(d).end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls.back(), "A-post");
}

TEST_F(ChildTest, ACancelOfAResumedParentUndoesEveryCallTheChildMayHaveMade) {
  // An earlier owner may have run the child before it crashed; nothing of it is recorded.
  journal_.cancel_after_boundaries = 1;  // after pre
  idemsaga::steps::saga::SagaInput input;
  input.resumed = true;
  auto r = Run(Order(Gift()), input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(r.compensated, (Calls{"post", "gift", "pre"}));
  for (const char* key : {"A-gift-payment-compensate", "A-gift-inventory-compensate"}) {
    EXPECT_EQ(std::count(fake_.calls.begin(), fake_.calls.end(), key), 1) << key;
  }
  EXPECT_EQ(std::count(fake_.calls.begin(), fake_.calls.end(), "A-gift-payment"), 0);
}

TEST_F(ChildTest, AChildsLongestRunCountsInItsParents) {
  Definition cool("cool_off");
  cool.Sleep("wait", 1h).Step("notify", fake_.Step(), fake_.Step());
  idemsaga::steps::saga::RetryPolicy policy;
  policy.step_deadline = 2min;
  EXPECT_EQ(idemsaga::steps::saga::LongestRun(policy, Order(std::move(cool))),
            2min + (1h + 2min) + 2min);
  EXPECT_THROW(Definition("x").Child("c", Gift(), nullptr), std::invalid_argument);
}

}  // namespace
