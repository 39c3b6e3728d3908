// Parallel groups: branches that overlap, each under its own key; a failure that stops the
// siblings and compensates in the reverse order the branches finished; a group that parks,
// defers or is fenced as one. Scripted participants and an in-memory journal; no sleeping.
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

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

class ParallelTest : public ::testing::Test {
 protected:
  ParallelTest() { journal_.can_park = true; }

  idemsaga::steps::saga::SagaResult Run(const Definition& d,
                                        idemsaga::steps::saga::SagaInput input = {}) {
    return test_support::RunAsA(d, policy_, journal_, std::move(input),
                                [this](std::chrono::milliseconds ms) {
                                  if (real_sleep_) std::this_thread::sleep_for(ms);
                                  std::lock_guard lock(mu_);
                                  slept_.push_back(ms);
                                });
  }
  idemsaga::steps::saga::SagaResult Resume(const Definition& d,
                                           std::vector<StepRecord> checkpoint) {
    idemsaga::steps::saga::SagaInput input;
    input.resumed = true;
    input.checkpoint = std::move(checkpoint);
    return Run(d, input);
  }
  idemsaga::steps::saga::Branch Call(std::string name) {
    return {std::move(name), fake_.Step(), fake_.Step()};
  }
  // pre, then inventory | payment | shipping side by side, then post.
  Definition Order() {
    Definition d("order");
    d.Step("pre", fake_.Step(), fake_.Step())
        .Parallel({Call("inventory"), Call("payment"), Call("shipping")})
        .Step("post", fake_.Step(), fake_.Step());
    return d;
  }
  static const StepRecord& Step(const idemsaga::steps::saga::SagaResult& r,
                                const std::string& name) {
    return test_support::StepNamed(r.steps, name);
  }
  static long Count(const Calls& calls, const std::string& key) {
    return std::count(calls.begin(), calls.end(), key);
  }

  test_support::FakeParticipants fake_;
  test_support::FakeJournal journal_;
  idemsaga::steps::saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
  std::mutex mu_;
  std::vector<std::chrono::milliseconds> slept_;
  bool real_sleep_ = false;
};

TEST_F(ParallelTest, BranchesOverlapEachUnderItsOwnKeyAndTheSagaGoesOnWhenAllHaveSucceeded) {
  // No branch answers before all three have been called: run one after the other, they would
  // wait out the fake's 5 s and say so. Then they answer shipping, payment, inventory.
  fake_.Together({"A-inventory", "A-payment", "A-shipping"});
  fake_.After("A-inventory", "A-payment");
  fake_.After("A-payment", "A-shipping");
  auto r = Run(Order());
  EXPECT_FALSE(fake_.timed_out);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  for (const char* key : {"A-pre", "A-inventory", "A-payment", "A-shipping", "A-post"}) {
    EXPECT_EQ(Count(fake_.calls, key), 1) << key;
  }
  EXPECT_EQ(fake_.calls.front(), "A-pre");
  EXPECT_EQ(fake_.calls.back(), "A-post");
  EXPECT_EQ(r.outputs["inventory"]["inventory_id"], "inventory-1");
  EXPECT_EQ(r.outputs["shipping"]["shipping_id"], "shipping-1");
  // The order they finished in: shipping, then payment, then inventory.
  EXPECT_EQ(Step(r, "shipping").finish_order, 1);
  EXPECT_EQ(Step(r, "payment").finish_order, 2);
  EXPECT_EQ(Step(r, "inventory").finish_order, 3);
  EXPECT_EQ(Step(r, "post").finish_order, 0);
}

TEST_F(ParallelTest, TheTraceShowsTheBranchesSideBySideUnderTheSaga) {
  std::mutex spans_mu;
  std::vector<idemsaga::common::trace::SpanData> spans;
  idemsaga::common::trace::Exporter exporter(
      [&](const std::vector<idemsaga::common::trace::SpanData>& batch) {
        std::lock_guard lock(spans_mu);
        spans.insert(spans.end(), batch.begin(), batch.end());
        return true;
      },
      {});
  idemsaga::common::trace::Tracer tracer("orchestrator", &exporter);
  fake_.Together({"A-inventory", "A-payment"});
  Definition d("order");
  d.Parallel({Call("inventory"), Call("payment")});
  idemsaga::steps::saga::SagaInput input{
      .tenant_id = "demo", .parent_key = "A", .trace_id = std::string(32, 'a')};
  idemsaga::steps::saga::Runner runner(d, policy_, {}, {}, &tracer);
  ASSERT_EQ(runner.Run(input, journal_).end, SagaEnd::kCompleted);
  EXPECT_FALSE(fake_.timed_out);
  exporter.Flush();
  std::map<std::string, idemsaga::common::trace::SpanData> by_name;
  for (const auto& s : spans) by_name[s.name] = s;
  ASSERT_TRUE(by_name.count("saga order") && by_name.count("step inventory") &&
              by_name.count("step payment"));
  const auto& inventory = by_name["step inventory"];
  const auto& payment = by_name["step payment"];
  EXPECT_EQ(inventory.parent_span_id, by_name["saga order"].span_id);
  EXPECT_EQ(payment.parent_span_id, by_name["saga order"].span_id);
  EXPECT_LT(inventory.start_unix_nano, payment.end_unix_nano);  // they overlap
  EXPECT_LT(payment.start_unix_nano, inventory.end_unix_nano);
  EXPECT_EQ(std::get<std::string>(inventory.attributes.at("parallel_group")), "inventory");
  EXPECT_EQ(std::get<std::string>(payment.attributes.at("parallel_group")), "inventory");
}

TEST_F(ParallelTest, ABranchSeesTheOutputsBeforeTheGroupAndNeverASiblings) {
  std::mutex seen_mu;
  std::vector<std::string> seen;
  auto answer = fake_.Step();
  auto look = [&](idemsaga::steps::saga::StepContext& ctx) {
    auto r = answer(ctx);
    std::lock_guard lock(seen_mu);
    seen.push_back(ctx.step_name + ":" + (ctx.Output("pre").is_null() ? "no-pre" : "pre") + ":" +
                   (ctx.Output("inventory").is_null() ? "no-inventory" : "inventory"));
    return r;
  };
  Definition d("order");
  d.Step("pre", fake_.Step(), fake_.Step())
      .Parallel({{"payment", look, fake_.Step()}, {"inventory", fake_.Step(), fake_.Step()}})
      .Step("post", look, fake_.Step());
  fake_.After("A-payment", "A-inventory");  // payment looks once inventory has answered
  auto r = Run(d);
  EXPECT_FALSE(fake_.timed_out);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(seen, (Calls{"payment:pre:no-inventory", "post:pre:inventory"}));
}

TEST_F(ParallelTest, AFailedBranchCompensatesItsSiblingsInReverseOrderOfFinishingThenTheSteps) {
  fake_.After("A-inventory", "A-payment");  // payment finishes first, then inventory
  fake_.After("A-shipping", "A-inventory");
  fake_.Script("A-shipping", {StepResult::Terminal(422, "no_carrier", "no carrier")});
  auto r = Run(Order());
  EXPECT_FALSE(fake_.timed_out);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failed_step, "shipping");
  EXPECT_EQ(r.failure.error_code, "no_carrier");
  EXPECT_EQ(Step(r, "shipping").status, StepStatus::kFailed);
  EXPECT_EQ(r.compensated, (Calls{"inventory", "payment", "pre"}));
  // The decision was durable before any compensation was sent, with every branch in it.
  ASSERT_EQ(journal_.events.front(), "begin_compensation:shipping");
  EXPECT_EQ(test_support::StepNamed(journal_.compensating_steps, "payment").status,
            StepStatus::kCompensating);
  EXPECT_EQ(Count(fake_.calls, "A-post"), 0);
  EXPECT_EQ(Count(fake_.calls, "A-shipping-compensate"), 0);  // refused: nothing applied
  EXPECT_EQ((Calls(fake_.calls.end() - 3, fake_.calls.end())),
            (Calls{"A-inventory-compensate", "A-payment-compensate", "A-pre-compensate"}));
}

TEST_F(ParallelTest, ASiblingStillRetryingSendsNoFurtherAttemptAndIsUndoneAsPossiblyApplied) {
  // Payment is sent first and times out; inventory is refused meanwhile; payment's retry
  // comes 300 ms later (really slept), long after the refusal.
  fake_.After("A-inventory", "A-payment");
  fake_.Script("A-inventory", {StepResult::Terminal(409, "out_of_stock", "none left")});
  StepResult timed_out = StepResult::InDoubt("timed out");
  timed_out.retry_after = 300ms;
  fake_.Script("A-payment", {timed_out});
  real_sleep_ = true;
  Definition d("order");
  d.Parallel({Call("inventory"), Call("payment")});
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failed_step, "inventory");
  EXPECT_EQ(Step(r, "payment").attempts, 1);  // not the policy's 4
  EXPECT_EQ(Count(fake_.calls, "A-payment"), 1);
  EXPECT_EQ(r.compensated, (Calls{"payment"}));
  EXPECT_FALSE(Step(r, "payment").action_confirmed);  // a compensation of a doubt
}

TEST_F(ParallelTest, ALongRetryAfterParksTheGroupAndAResumeSendsOnlyTheBranchThatWaited) {
  StepResult busy = StepResult::Retryable("busy", 503);
  busy.retry_after = 30s;
  fake_.Script("A-payment", {busy, StepResult::Succeeded({{"charge_id", "ch_1"}})});
  Definition d = Order();
  auto r = Run(d);
  ASSERT_EQ(r.end, SagaEnd::kParked);
  EXPECT_GT(journal_.parked_for, 29s);
  EXPECT_LE(journal_.parked_for, 30s);
  EXPECT_EQ(test_support::StepNamed(journal_.checkpoint, "inventory").status,
            StepStatus::kSucceeded);
  EXPECT_EQ(test_support::StepNamed(journal_.checkpoint, "shipping").status,
            StepStatus::kSucceeded);
  EXPECT_EQ(test_support::StepNamed(journal_.checkpoint, "payment").attempts, 1);
  fake_.calls.clear();
  auto resumed = Resume(d, journal_.checkpoint);
  EXPECT_EQ(resumed.end, SagaEnd::kCompleted);
  EXPECT_EQ(fake_.calls, (Calls{"A-payment", "A-post"}));
  EXPECT_EQ(Step(resumed, "payment").attempts, 2);
  EXPECT_EQ(resumed.outputs["payment"]["charge_id"], "ch_1");
  // Finishing orders carry on from the checkpoint's.
  EXPECT_EQ(Step(resumed, "payment").finish_order, 3);
}

TEST_F(ParallelTest, TwoBranchesWaitingOutRetryAfterParkUntilBothAreDue) {
  StepResult soon = StepResult::Retryable("busy", 503);
  soon.retry_after = 2s;
  StepResult later = StepResult::Retryable("busy", 503);
  later.retry_after = 60s;
  fake_.Script("A-inventory", {soon, StepResult::Succeeded({})});
  fake_.Script("A-payment", {later, StepResult::Succeeded({})});
  Definition d("order");
  d.Parallel({Call("inventory"), Call("payment")});
  ASSERT_EQ(Run(d).end, SagaEnd::kParked);
  // Woken no earlier than the payment participant asked: its Retry-After is honoured.
  EXPECT_GT(journal_.parked_for, 59s);
  EXPECT_LE(journal_.parked_for, 60s);
}

TEST_F(ParallelTest, ABlockedBranchStopsItsSiblingsFromSendingMore) {
  // Inventory is blocked at once; payment, sent alongside, keeps failing and would retry 4
  // times, 300 ms apart (really slept), if nothing stopped it.
  fake_.Together({"A-inventory", "A-payment"});
  fake_.Script("A-inventory", {StepResult::Blocked(401, "wrong token")});
  StepResult busy = StepResult::Retryable("busy", 503);
  busy.retry_after = 300ms;
  fake_.Script("A-payment", {busy});
  real_sleep_ = true;
  Definition d("order");
  d.Parallel({Call("inventory"), Call("payment")});
  EXPECT_EQ(Run(d).end, SagaEnd::kDeferred);
  EXPECT_EQ(Count(fake_.calls, "A-payment"), 1);
  EXPECT_EQ(journal_.events, (Calls{"stuck"}));
}

TEST_F(ParallelTest, AConditionThatThrowsForOneBranchSkipsNoneOfTheGroup) {
  Definition d("order");
  // Asked per branch: inventory's answer is no, payment's throws.
  d.Parallel({Call("inventory"), Call("payment")}).When([](const StepContext& ctx) -> bool {
    if (ctx.step_name == "payment") throw std::runtime_error("boom");
    return false;
  });
  EXPECT_EQ(Run(d).end, SagaEnd::kDeferred);
  EXPECT_EQ(test_support::StepNamed(journal_.compensating_steps, "inventory").status,
            StepStatus::kNotRun);
  EXPECT_TRUE(fake_.calls.empty());
}

TEST_F(ParallelTest, AShortWaitIsSleptAndTheWaitingBranchTriedAgain) {
  StepResult busy = StepResult::Retryable("busy", 503);
  busy.retry_after = 200ms;
  fake_.Script("A-payment", {busy, StepResult::Succeeded({})});
  auto r = Run(Order());
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(Count(fake_.calls, "A-payment"), 2);
  EXPECT_TRUE(journal_.events.empty());
}

TEST_F(ParallelTest, ABlockedBranchDefersTheSagaOnceWithEveryBranchsRecord) {
  fake_.Together({"A-inventory", "A-payment", "A-shipping"});  // all sent before it is blocked
  fake_.Script("A-payment", {StepResult::Blocked(401, "wrong token")});
  auto r = Run(Order());
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(journal_.events, (Calls{"stuck"}));
  EXPECT_EQ(test_support::StepNamed(journal_.compensating_steps, "inventory").status,
            StepStatus::kSucceeded);
  EXPECT_EQ(test_support::StepNamed(journal_.compensating_steps, "payment").detail, "wrong token");
}

TEST_F(ParallelTest, ALostLeaseStopsEveryBranchAndWritesNothing) {
  journal_.lose_lease_after = 2;  // pre's check, then one branch's
  auto r = Run(Order());
  EXPECT_EQ(r.end, SagaEnd::kFenced);
  EXPECT_TRUE(journal_.events.empty());
  EXPECT_EQ(Count(fake_.calls, "A-post"), 0);
  EXPECT_EQ(fake_.calls.size(), 2u);  // pre and the one branch that had the lease
}

TEST_F(ParallelTest, AResumedCompensationKeepsTheOrderTheBranchesFinishedIn) {
  Definition d = Order();
  std::vector<StepRecord> records;
  for (const auto& [name, order] : std::vector<std::pair<std::string, int>>{
           {"pre", 0}, {"inventory", 1}, {"payment", 3}, {"shipping", 2}, {"post", 0}}) {
    StepRecord s;
    s.name = name;
    s.action_key = "A-" + name;
    s.status = name == "post" ? StepStatus::kFailed : StepStatus::kCompensating;
    s.finish_order = order;
    records.push_back(StepRecord::FromJson(s.ToJson()));  // as stored
  }
  idemsaga::steps::saga::SagaInput input;
  input.resumed = true;
  input.compensating = records;
  input.failed_step = "post";
  auto r = Run(d, input);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.compensated, (Calls{"payment", "shipping", "inventory", "pre"}));
}

TEST_F(ParallelTest, WhenAfterAGroupDecidesForEveryBranch) {
  Definition d("order");
  d.Step("pre", fake_.Step(), fake_.Step())
      .Parallel({Call("inventory"), Call("payment")})
      .When([](const StepContext& ctx) { return ctx.Input<nlohmann::json>().value("go", false); })
      .Step("post", fake_.Step(), fake_.Step());
  idemsaga::steps::saga::SagaInput input;
  input.request = {{"go", false}};
  auto r = Run(d, input);
  EXPECT_EQ(r.end, SagaEnd::kCompleted);
  EXPECT_EQ(Step(r, "inventory").status, StepStatus::kSkipped);
  EXPECT_EQ(Step(r, "payment").status, StepStatus::kSkipped);
  EXPECT_EQ(fake_.calls, (Calls{"A-pre", "A-post"}));
}

TEST_F(ParallelTest, ACancelBeforeTheGroupRunsNoBranch) {
  journal_.cancel_after_boundaries = 1;  // after pre
  auto r = Run(Order());
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(r.failure.error_code, "saga_cancelled");
  EXPECT_EQ(fake_.calls, (Calls{"A-pre", "A-pre-compensate"}));
}

TEST(ParallelDefinition, AGroupNeedsTwoToSixteenDistinctBranchesAndIsAddedWholeOrNotAtAll) {
  test_support::FakeParticipants fake;
  auto branch = [&](std::string name) {
    return idemsaga::steps::saga::Branch{std::move(name), fake.Step(), fake.Step()};
  };
  Definition d("order");
  d.Step("pre", fake.Step(), fake.Step());
  EXPECT_THROW(d.Parallel({branch("one")}), std::invalid_argument);
  std::vector<idemsaga::steps::saga::Branch> many;
  for (int i = 0; i < 17; ++i) many.push_back(branch("b" + std::to_string(i)));
  EXPECT_THROW(d.Parallel(many), std::invalid_argument);
  EXPECT_THROW(d.Parallel({branch("a"), branch("pre")}), std::invalid_argument);
  EXPECT_THROW(d.Parallel({branch("a"), branch("Bad-Name")}), std::invalid_argument);
  EXPECT_THROW(d.Parallel({branch("a"), {"b", fake.Step(), nullptr}}), std::invalid_argument);
  ASSERT_EQ(d.steps().size(), 1u);
  d.Parallel({branch("a"), branch("b")});
  ASSERT_EQ(d.steps().size(), 3u);
  EXPECT_EQ(d.steps()[0].group, -1);
  EXPECT_EQ(d.steps()[1].group, 1);
  EXPECT_EQ(d.steps()[2].group, 1);
}

TEST(ParallelUndoOrder, BranchesAreUndoneInReverseOfFinishingThoseThatDidNotEndFirst) {
  test_support::FakeParticipants fake;
  Definition d("order");
  d.Step("pre", fake.Step(), fake.Step())
      .Parallel({{"a", fake.Step(), fake.Step()},
                 {"b", fake.Step(), fake.Step()},
                 {"c", fake.Step(), fake.Step()}})
      .Step("post", fake.Step(), fake.Step());
  std::vector<StepRecord> records(5);
  const char* names[] = {"pre", "a", "b", "c", "post"};
  const int finished[] = {0, 2, 0, 1, 0};  // c ended first, then a; b never ended
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].name = names[i];
    records[i].finish_order = finished[i];
  }
  EXPECT_EQ(idemsaga::steps::saga::UndoOrder(records, &d), (std::vector<size_t>{4, 2, 1, 3, 0}));
  EXPECT_EQ(idemsaga::steps::saga::UndoOrder(records, nullptr),
            (std::vector<size_t>{4, 3, 2, 1, 0}));
}

TEST(ParallelDefinition, AGroupLastsAsLongAsItsLongestBranch) {
  test_support::FakeParticipants fake;
  idemsaga::steps::saga::RetryPolicy policy;
  policy.step_deadline = 2min;
  Definition d("order");
  d.Step("pre", fake.Step(), fake.Step())
      .Parallel({{"a", fake.Step(), fake.Step()},
                 {"b", fake.Step(), fake.Step(), {.step_deadline = 5min}},
                 {"c", fake.Step(), fake.Step()}})
      .Sleep("cool_off", 1h);
  EXPECT_EQ(idemsaga::steps::saga::LongestRun(policy, d), 2min + 5min + 1h);
}

}  // namespace
