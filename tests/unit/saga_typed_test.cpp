// Typed outputs (Definition::Output<T>, ctx.Output<T>) and a saga's declared answer
// (Definition::Answer), against scripted participants and an in-memory journal.
#include <gtest/gtest.h>

#include "steps/saga/fields.hpp"
#include "steps/saga/runner.hpp"
#include "tests/support/saga_fakes.hpp"

namespace {

using idemsaga::steps::saga::Definition;
using idemsaga::steps::saga::SagaEnd;
using idemsaga::steps::saga::StepContext;
using idemsaga::steps::saga::StepResult;
using idemsaga::steps::saga::StepStatus;

struct Reservation {
  std::string id;
  long long units = 0;
};

Reservation ParseReservation(const nlohmann::json& output) {
  if (!output.contains("reservation_id") || !output["reservation_id"].is_string()) {
    throw idemsaga::steps::saga::InvalidInput("reservation_id must be a string");
  }
  return {output["reservation_id"], output.value("units", 0LL)};
}

class TypedTest : public ::testing::Test {
 protected:
  idemsaga::steps::saga::SagaResult Run(const Definition& d,
                                        idemsaga::steps::saga::SagaInput input = {}) {
    return test_support::RunAsA(d, policy_, journal_, std::move(input));
  }
  test_support::FakeParticipants fake_;
  test_support::FakeJournal journal_;
  idemsaga::steps::saga::RetryPolicy policy_{.max_attempts = 4, .compensation_stuck_after = 8};
};

TEST_F(TypedTest, LaterStepsAndCompensationsReadADeclaredOutputAsItsType) {
  fake_.Script("A-inventory", {StepResult::Succeeded({{"reservation_id", "res_7"}, {"units", 3}})});
  fake_.Script("A-shipping", {StepResult::Terminal(422, "undeliverable", "no such address")});
  std::vector<std::string> seen;
  auto release = [&](StepContext& ctx) {
    auto r = ctx.Output<Reservation>("inventory");
    seen.push_back("release " + r.id + " x" + std::to_string(r.units));
    return StepResult::Succeeded({});
  };
  auto ship = [&](StepContext& ctx) {
    seen.push_back("ship " + ctx.Output<Reservation>("inventory").id);
    return fake_.Step()(ctx);
  };
  Definition d("typed");
  d.Step("inventory", fake_.Step(), release)
      .Output<Reservation>(ParseReservation)
      .Step("shipping", ship, fake_.Step());
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kFailed);
  EXPECT_EQ(seen, (std::vector<std::string>{"ship res_7", "release res_7 x3"}));
}

TEST_F(TypedTest, AnAnswerThatDoesNotParseStopsTheSagaStuckAsPossiblyAppliedNeverUndoneOnAGuess) {
  fake_.Script("A-inventory", {StepResult::Succeeded({{"reservation", "res_7"}})});
  Definition d("typed");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Output<Reservation>(ParseReservation)
      .Step("shipping", fake_.Step(), fake_.Step());
  auto r = Run(d);
  EXPECT_EQ(r.end, SagaEnd::kDeferred);
  EXPECT_EQ(journal_.events, (std::vector<std::string>{"stuck"}));
  auto inventory = test_support::StepNamed(journal_.compensating_steps, "inventory");
  EXPECT_TRUE(inventory.maybe_applied);
  EXPECT_NE(inventory.detail.find("reservation_id must be a string"), std::string::npos)
      << inventory.detail;
  EXPECT_EQ(fake_.calls, (std::vector<std::string>{"A-inventory"}));  // not retried, not undone
}

TEST_F(TypedTest, ReadingAnUntypedOrAMissingOutputAsATypeIsRefused) {
  std::string untyped, missing;
  auto look = [&](StepContext& ctx) {
    try {
      ctx.Output<Reservation>("inventory");
    } catch (const std::logic_error& e) {
      untyped = e.what();
    }
    try {
      ctx.Output<Reservation>("later");
    } catch (const std::out_of_range& e) {
      missing = e.what();
    }
    return StepResult::Succeeded({});
  };
  Definition d("typed");
  d.Step("inventory", fake_.Step(), fake_.Step())
      .Step("look", look, fake_.Step())
      .Step("later", fake_.Step(), fake_.Step())
      .Output<Reservation>(ParseReservation);
  fake_.Script("A-later", {StepResult::Succeeded({{"reservation_id", "res_8"}})});
  EXPECT_EQ(Run(d).end, SagaEnd::kCompleted);
  EXPECT_NE(untyped.find("declares no output type"), std::string::npos) << untyped;
  EXPECT_NE(missing.find("has no output"), std::string::npos) << missing;
}

TEST_F(TypedTest, ACompletedSagaAnswersWhatItsDefinitionDeclares) {
  fake_.Script("A-inventory", {StepResult::Succeeded({{"reservation_id", "res_7"}, {"units", 3}})});
  Definition d("typed");
  d.Input<nlohmann::json>([](const nlohmann::json& body) { return body; })
      .Step("inventory", fake_.Step(), fake_.Step())
      .Output<Reservation>(ParseReservation)
      .Answer([](const StepContext& ctx) {
        return idemsaga::steps::saga::SuccessAnswer{
            200,
            {{"booked", ctx.Output<Reservation>("inventory").id},
             {"for", ctx.Input<nlohmann::json>()["customer"]},
             {"key", ctx.parent_key}}};
      });
  idemsaga::steps::saga::SagaInput input;
  input.request = {{"customer", "ada"}};
  auto r = Run(d, input);
  ASSERT_EQ(r.end, SagaEnd::kCompleted);
  ASSERT_TRUE(r.answer.has_value());
  EXPECT_EQ(r.answer->status, 200);
  EXPECT_EQ(r.answer->body, nlohmann::json({{"booked", "res_7"}, {"for", "ada"}, {"key", "A"}}));
}

TEST_F(TypedTest, AnAnswerThatThrowsOrIsNot2xxLeavesTheSagaStuckWithEveryStepDone) {
  for (auto answer : std::vector<idemsaga::steps::saga::AnswerFn>{
           [](const StepContext&) -> idemsaga::steps::saga::SuccessAnswer {
             throw std::runtime_error("boom");
           },
           [](const StepContext&) {
             return idemsaga::steps::saga::SuccessAnswer{500, nlohmann::json::object()};
           },
           [](const StepContext&) {
             return idemsaga::steps::saga::SuccessAnswer{201, std::string("\xff")};
           }}) {
    journal_.events.clear();
    Definition d("typed");
    d.Step("inventory", fake_.Step(), fake_.Step()).Answer(answer);
    auto r = Run(d);
    EXPECT_EQ(r.end, SagaEnd::kDeferred);
    EXPECT_FALSE(r.answer.has_value());
    EXPECT_EQ(journal_.events, (std::vector<std::string>{"stuck"}));
    EXPECT_EQ(test_support::StepNamed(journal_.compensating_steps, "inventory").status,
              StepStatus::kSucceeded);
  }
}

TEST(TypedDefinition, OutputTypesTheCallAddedLastAndNothingElse) {
  test_support::FakeParticipants fake;
  Definition d("typed");
  EXPECT_THROW(d.Output<Reservation>(ParseReservation), std::logic_error);
  d.Sleep("wait", std::chrono::seconds(1));
  EXPECT_THROW(d.Output<Reservation>(ParseReservation), std::logic_error);
  d.Step("inventory", fake.Step(), fake.Step()).Output<Reservation>(ParseReservation);
  EXPECT_TRUE(d.steps().back().parse_output);
  EXPECT_THROW(d.Answer(nullptr), std::invalid_argument);
}

}  // namespace
