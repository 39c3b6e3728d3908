// The test kit (include/idemsaga/testing.hpp) on small sagas and on the shipped place_order:
// scripted answers, compensation order, virtual time, events, crash-at-every-point and the
// determinism check, each of which must also be able to fail.
#include <gtest/gtest.h>

#include <atomic>

#include "idemsaga/testing.hpp"
#include "steps/deliver_order.hpp"
#include "steps/place_order.hpp"

namespace {

using namespace std::chrono_literals;
namespace kit = idemsaga::testing;
using idemsaga::Definition;
using idemsaga::StepContext;
using kit::Reply;
using Keys = std::vector<std::string>;

// hotel, then flight, then car: each a POST of the trip's city, compensated by a cancel.
Definition Trip(idemsaga::Participants& p) {
  Definition d("trip");
  for (const char* name : {"hotel", "flight", "car"}) {
    auto& client = p.Get(name);
    d.Step(
        name,
        [&client, name](StepContext& ctx) {
          return client.Post(std::string("/v1/") + name, ctx,
                             {{"city", ctx.Input<nlohmann::json>().at("city")}});
        },
        [&client, name](StepContext& ctx) {
          return client.Compensate(std::string("/v1/") + name + "/cancel", ctx);
        });
  }
  return d;
}

void AddTripParticipants(kit::Environment& env) {
  for (const char* name : {"hotel", "flight", "car"}) env.participants().Add(name);
}

const nlohmann::json kOslo = {{"city", "Oslo"}};

// Real time a test body takes: the kit's waits are virtual.
template <typename F>
std::chrono::milliseconds RealTime(F&& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               start);
}

TEST(TestingKit, RecordsEveryCallWithItsDerivedKeyBodyAndAttemptInOrder) {
  kit::Environment env;
  AddTripParticipants(env);
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.CallKeys(), (Keys{"A-hotel", "A-flight", "A-car"}));
  ASSERT_EQ(r.calls.size(), 3U);
  EXPECT_EQ(r.calls[0].participant, "hotel");
  EXPECT_EQ(r.calls[0].path, "/v1/hotel");
  EXPECT_EQ(r.calls[0].step, "hotel");
  EXPECT_EQ(r.calls[0].body, (nlohmann::json{{"city", "Oslo"}}));
  EXPECT_EQ(r.calls[0].attempt, 1);
  EXPECT_EQ(r.calls[0].kind, kit::CallKind::kAction);
  // The default answer: 201 with each output's *_id fields (unscripted: "<participant>_id").
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body.value("hotel_id", ""), "A-hotel");
  EXPECT_EQ(r.body.value("idempotency_key", ""), "A");
  EXPECT_EQ(r.body.value("status", ""), "completed");
  EXPECT_EQ(r.effects, (std::map<std::string, int>{
                           {"car A-car", 1}, {"flight A-flight", 1}, {"hotel A-hotel", 1}}));
  EXPECT_EQ(r.Step("flight")->status, "succeeded");
  EXPECT_EQ(r.Step("flight")->attempts, 1);
}

TEST(TestingKit, ARefusalCompensatesTheStepsBeforeInReverse) {
  kit::Environment env;
  AddTripParticipants(env);
  env.participants().Add("car").Script("A-car", {Reply::Refusal(409, "sold_out", "no cars")});
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.CallKeys(),
            (Keys{"A-hotel", "A-flight", "A-car", "A-flight-compensate", "A-hotel-compensate"}));
  EXPECT_EQ(r.compensated, (Keys{"flight", "hotel"}));
  EXPECT_EQ(r.calls[3].kind, kit::CallKind::kCompensation);
  EXPECT_EQ(r.calls[3].body,
            (nlohmann::json{{"action_key", "A-flight"}, {"action_applied", true}}));
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body.value("code", ""), "sold_out");
  EXPECT_EQ(r.body.value("detail", ""), "no cars");
  EXPECT_EQ(r.body.value("step", ""), "car");
  EXPECT_EQ(r.failed_step, "car");
  EXPECT_EQ(r.Step("car")->status, "failed");
  EXPECT_EQ(r.Step("hotel")->status, "compensated");
}

TEST(TestingKit, ARetryableAnswerIsRetriedUnderTheSameKeyThenSucceeds) {
  kit::Environment env;
  AddTripParticipants(env);
  env.participants().Add("flight").Script(
      "A-flight", {Reply::Retryable(), Reply::Success({{"flight_id", "SK123"}})});
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.CallKeys(), (Keys{"A-hotel", "A-flight", "A-flight", "A-car"}));
  EXPECT_EQ(r.CallsOf("A-flight")[1].attempt, 2);
  EXPECT_EQ(r.Step("flight")->attempts, 2);
  EXPECT_EQ(r.body.value("flight_id", ""), "SK123");
  EXPECT_EQ(r.runs, 1);  // a backoff under park_after is slept (virtually), not parked
}

TEST(TestingKit, ALongRetryAfterParksAndTheRunResumesAtItsWakeUpInVirtualTime) {
  kit::Environment env;
  AddTripParticipants(env);
  env.participants().Add("hotel").Script("A-hotel", {Reply::Retryable(30s), Reply::Success()});
  Definition d = Trip(env.participants());
  kit::Result r;
  auto real = RealTime([&] { r = env.Run(d, kOslo); });
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.runs, 2);  // parked, then resumed from its checkpoint
  EXPECT_GE(r.CallsOf("A-hotel")[1].at, 30s);
  EXPECT_EQ(r.CallsOf("A-hotel")[1].attempt, 2);  // the checkpoint kept the attempts
  EXPECT_GE(r.elapsed, 30s);
  EXPECT_EQ(r.body.value("hotel_id", ""), "A-hotel");  // Success() answers the default output
  EXPECT_LT(real, 2s);
}

TEST(TestingKit, AStepInDoubtUntilItsAttemptsRunOutIsCompensatedWithTheOthers) {
  kit::RunOptions options;
  options.policy.max_attempts = 3;
  kit::Environment env(options);
  AddTripParticipants(env);
  env.participants().Add("flight").Script("A-flight", {Reply::InDoubt()});
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.CallKeys(), (Keys{"A-hotel", "A-flight", "A-flight", "A-flight",
                                "A-flight-compensate", "A-hotel-compensate"}));
  EXPECT_EQ(r.compensated, (Keys{"flight", "hotel"}));
  // It may have been applied: its compensation says the action was not confirmed.
  EXPECT_EQ(r.CallsOf("A-flight-compensate")[0].body.value("action_applied", true), false);
  EXPECT_EQ(r.status, 502);
  EXPECT_EQ(r.body.value("code", ""), "flight_unavailable");
}

TEST(TestingKit, AnAnswerLostAfterItWasAppliedIsReplayedToTheRetry) {
  kit::Environment env;
  AddTripParticipants(env);
  env.participants().Add("flight").Script("A-flight", {Reply::InDoubt(/*applied=*/true)});
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kCompleted);
  ASSERT_EQ(r.CallsOf("A-flight").size(), 2U);
  EXPECT_TRUE(r.CallsOf("A-flight")[1].replayed);
  EXPECT_EQ(r.effects.at("flight A-flight"), 1);
}

TEST(TestingKit, ABlockedStepLeavesTheSagaStuck) {
  kit::Environment env;
  AddTripParticipants(env);
  env.participants().Add("hotel").Script("A-hotel", {Reply::Blocked(401, "bad token")});
  Definition d = Trip(env.participants());
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.end, kit::End::kStuck);
  EXPECT_EQ(r.status, 202);
  EXPECT_NE(r.stuck_detail.find("bad token"), std::string::npos) << r.stuck_detail;
  EXPECT_EQ(r.runs, 4);  // stuck_retries (3) resumes, then reported
}

TEST(TestingKit, TheAnswerIsTheOneTheDefinitionDeclaresAndOneThatCannotBeGivenIsStuck) {
  kit::Environment env;
  AddTripParticipants(env);
  Definition d = Trip(env.participants());
  d.Answer([](const StepContext& ctx) {
    return idemsaga::SuccessAnswer{200, {{"hotel", ctx.Output("hotel").at("hotel_id")}}};
  });
  auto r = env.Run(d, kOslo);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, (nlohmann::json{{"hotel", "A-hotel"}}));
  ASSERT_TRUE(r.answer.has_value());

  kit::Environment other;
  AddTripParticipants(other);
  Definition broken = Trip(other.participants());
  broken.Answer([](const StepContext&) { return idemsaga::SuccessAnswer{500, {}}; });
  auto s = other.Run(broken, kOslo);
  EXPECT_EQ(s.end, kit::End::kStuck);
  EXPECT_NE(s.stuck_detail.find("saga_stuck"), std::string::npos) << s.stuck_detail;
  // Resumed stuck_retries times from its checkpoint: every step done, none sent again.
  EXPECT_EQ(s.runs, 4);
  EXPECT_EQ(s.CallKeys(), (Keys{"A-hotel", "A-flight", "A-car"}));
}

TEST(TestingKit, ADelayedAnswerTakesVirtualTimeAndPastTheCallTimeoutIsInDoubt) {
  kit::Environment env;
  env.participants().Add("slow").Script("A-slow", {Reply::Success({{"ok", true}}).After(3s)});
  auto& slow = env.participants().Get("slow");
  Definition d("slow");
  d.Step(
      "slow", [&](StepContext& ctx) { return slow.Post("/v1/slow", ctx, {}); },
      [&](StepContext& ctx) { return slow.Compensate("/v1/slow/undo", ctx); },
      {.call_timeout = 1s});
  auto r = env.Run(d, nlohmann::json::object());
  // Past the call timeout: in doubt, though the participant applied it; the retry replays.
  EXPECT_EQ(r.end, kit::End::kCompleted);
  ASSERT_EQ(r.CallsOf("A-slow").size(), 2U);
  EXPECT_EQ(r.CallsOf("A-slow")[0].answer, idemsaga::Outcome::kInDoubt);
  EXPECT_TRUE(r.CallsOf("A-slow")[1].replayed);
  EXPECT_GE(r.elapsed, 1s);
  EXPECT_LT(r.elapsed, 3s);
}

TEST(TestingKit, ATimerRunsInVirtualTimeNotRealTime) {
  kit::Environment env;
  AddTripParticipants(env);
  auto& hotel = env.participants().Get("hotel");
  auto& car = env.participants().Get("car");
  Definition d("cooloff");
  d.Step(
       "hotel", [&](StepContext& ctx) { return hotel.Post("/v1/hotel", ctx, {}); },
       [&](StepContext& ctx) { return hotel.Compensate("/v1/hotel/cancel", ctx); })
      .Sleep("cooloff", 2h)
      .Step(
          "car", [&](StepContext& ctx) { return car.Post("/v1/car", ctx, {}); },
          [&](StepContext& ctx) { return car.Compensate("/v1/car/cancel", ctx); });
  kit::Result r;
  auto real = RealTime([&] { r = env.Run(d, nlohmann::json::object()); });
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_GE(r.CallsOf("A-car")[0].at, 2h);
  EXPECT_LT(r.CallsOf("A-car")[0].at, 2h + 1min);
  EXPECT_EQ(r.runs, 2);  // parked on the timer, resumed when due
  EXPECT_EQ(r.Step("cooloff")->status, "succeeded");
  EXPECT_LT(real, 2s);
}

// hotel, then a wait for `approved` or `rejected` (15 min), then car.
Definition Approval(idemsaga::Participants& p) {
  auto& hotel = p.Get("hotel");
  auto& car = p.Get("car");
  Definition d("approval");
  d.Step(
       "hotel", [&](StepContext& ctx) { return hotel.Post("/v1/hotel", ctx, {}); },
       [&](StepContext& ctx) { return hotel.Compensate("/v1/hotel/cancel", ctx); })
      .Await("approval", {.events = {"approved", "rejected"}, .timeout = 15min})
      .Step(
          "car", [&](StepContext& ctx) { return car.Post("/v1/car", ctx, {}); },
          [&](StepContext& ctx) { return car.Compensate("/v1/car/cancel", ctx); });
  return d;
}

TEST(TestingKit, AnEventWaitTimesOutInVirtualTimeAndCompensates) {
  kit::Environment env;
  AddTripParticipants(env);
  Definition d = Approval(env.participants());
  kit::Result r;
  auto real = RealTime([&] { r = env.Run(d, nlohmann::json::object()); });
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.body.value("code", ""), "event_timeout");
  EXPECT_EQ(r.compensated, (Keys{"hotel"}));
  EXPECT_GE(r.elapsed, 15min);
  EXPECT_LT(real, 2s);
}

TEST(TestingKit, AnAwaitIsSatisfiedByAnEventSentBeforeTheRun) {
  kit::Environment env;
  AddTripParticipants(env);
  env.Send("approved", {{"by", "alice"}});
  Definition d = Approval(env.participants());
  auto r = env.Run(d, nlohmann::json::object());
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.outputs["approval"],
            (nlohmann::json{{"event", "approved"}, {"payload", {{"by", "alice"}}}}));
  EXPECT_EQ(r.runs, 1);
  EXPECT_EQ(r.CallKeys(), (Keys{"A-hotel", "A-car"}));
}

TEST(TestingKit, AnAwaitIsSatisfiedByAnEventSentWhileTheRunWaits) {
  kit::Environment env;
  AddTripParticipants(env);
  env.SendAfter(5min, "rejected");
  Definition d = Approval(env.participants());
  auto r = env.Run(d, nlohmann::json::object());
  // The default decision takes any event as success; the run was woken at 5 minutes.
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.outputs["approval"].value("event", ""), "rejected");
  EXPECT_EQ(r.runs, 2);
  EXPECT_GE(r.CallsOf("A-car")[0].at, 5min);
  EXPECT_LT(r.CallsOf("A-car")[0].at, 6min);
}

kit::CheckOptions TripSetup() {
  kit::CheckOptions o;
  o.setup = AddTripParticipants;
  return o;
}

TEST(TestingKit, ACorrectSagaEndsTheSameAfterACrashAtEveryPoint) {
  auto o = TripSetup();
  o.setup = [](kit::Environment& env) {
    AddTripParticipants(env);
    env.participants().Add("car").Script("A-car",
                                         {Reply::Retryable(), Reply::Refusal(409, "sold_out")});
  };
  auto report = kit::CheckCrashes(Trip, kOslo, o);
  EXPECT_EQ(report.reference.end, kit::End::kFailed);
  // Boundaries before each of three steps, each call (4 actions, 2 compensations), and the
  // decision to compensate.
  EXPECT_EQ(report.points, 10);
  for (const auto& d : report.differences) {
    ADD_FAILURE() << "point " << d.point << " (" << d.where << "): " << d.difference;
  }
}

TEST(TestingKit, ACorrectSagaWithWaitsEndsTheSameAfterACrashAtEveryPoint) {
  kit::CheckOptions o;
  o.setup = [](kit::Environment& env) {
    AddTripParticipants(env);
    env.SendAfter(5min, "approved");
  };
  auto report = kit::CheckCrashes(Approval, {}, o);
  EXPECT_EQ(report.reference.end, kit::End::kCompleted);
  EXPECT_GT(report.points, 3);
  EXPECT_TRUE(report.differences.empty())
      << report.differences[0].where << ": " << report.differences[0].difference;
}

// A saga whose hotel request carries a counter that changes at every call: not a pure
// function of the input.
idemsaga::SagaFactory CounterSaga(std::shared_ptr<std::atomic<int>> counter) {
  return [counter](idemsaga::Participants& p) {
    auto& hotel = p.Get("hotel");
    auto& car = p.Get("car");
    Definition d("counter");
    d.Step(
         "hotel",
         [&hotel, counter](StepContext& ctx) {
           return hotel.Post("/v1/hotel", ctx, {{"request_number", (*counter)++}});
         },
         [&hotel](StepContext& ctx) { return hotel.Compensate("/v1/hotel/cancel", ctx); })
        .Step(
            "car", [&car](StepContext& ctx) { return car.Post("/v1/car", ctx, {}); },
            [&car](StepContext& ctx) { return car.Compensate("/v1/car/cancel", ctx); });
    return d;
  };
}

TEST(TestingKit, ACrashCheckFindsARequestThatChangesWhenItIsSentAgain) {
  auto report = kit::CheckCrashes(CounterSaga(std::make_shared<std::atomic<int>>(0)),
                                  nlohmann::json::object(), TripSetup());
  EXPECT_EQ(report.reference.end, kit::End::kCompleted);
  ASSERT_FALSE(report.differences.empty());
  // A crash before the hotel's answer is recorded: its resend is refused, the saga stuck.
  bool stuck = false;
  for (const auto& d : report.differences) {
    stuck = stuck || d.difference.find("step_request_changed") != std::string::npos;
  }
  EXPECT_TRUE(stuck) << report.differences[0].difference;
}

TEST(TestingKit, ACrashCheckFindsAKeyAppliedTwiceByAParticipantWithoutAGuard) {
  auto o = TripSetup();
  o.setup = [](kit::Environment& env) {
    AddTripParticipants(env);
    env.participants().Add("hotel").Unguarded();
  };
  auto report = kit::CheckCrashes(Trip, kOslo, o);
  ASSERT_FALSE(report.differences.empty());
  EXPECT_NE(report.differences[0].difference.find("hotel A-hotel applied 2 times"),
            std::string::npos)
      << report.differences[0].difference;
}

TEST(TestingKit, CheckDeterministicFlagsABodyThatChangesAndPassesAPureOne) {
  auto diffs = kit::CheckDeterministic(CounterSaga(std::make_shared<std::atomic<int>>(0)),
                                       nlohmann::json::object(), TripSetup());
  ASSERT_EQ(diffs.size(), 1U);
  EXPECT_EQ(diffs[0].step, "hotel");
  EXPECT_EQ(diffs[0].derived_key, "A-hotel");
  EXPECT_EQ(diffs[0].first, "/v1/hotel {\"request_number\":0}");
  EXPECT_EQ(diffs[0].second, "/v1/hotel {\"request_number\":1}");
  EXPECT_TRUE(kit::CheckDeterministic(Trip, kOslo, TripSetup()).empty());
}

// The shipped place_order saga, over the kit's participants.
std::optional<Definition> PlaceOrder(idemsaga::Participants& p) {
  return idemsaga::steps::MakePlaceOrderSaga(p.Get("inventory"), p.Get("payment"));
}

const nlohmann::json kOrder = {{"customer_id", "cust_1"},
                               {"items", {{{"sku", "widget"}, {"quantity", 2}}}},
                               {"amount_cents", 2500},
                               {"currency", "USD"},
                               {"payment_method", "pm_card_3ds"}};

kit::CheckOptions ThreeDSecure() {
  kit::CheckOptions o;
  o.setup = [](kit::Environment& env) {
    env.participants()
        .Add("inventory")
        .DefaultOutput({{"reservation_id", "res_0123456789abcdef0123456789abcdef"}});
    env.participants().Add("payment").Script(
        "A-payment", {Reply::Success({{"charge_id", "ch_0123456789abcdef0123456789abcdef"},
                                      {"status", "requires_action"}})});
    env.SendAfter(2min, "payment_confirmed");
  };
  return o;
}

TEST(TestingKit, RunsTheShippedPlaceOrderSagaWithItsThreeDSecureWait) {
  auto r = kit::Run(PlaceOrder, kOrder, ThreeDSecure());
  EXPECT_EQ(r.end, kit::End::kCompleted);
  EXPECT_EQ(r.CallKeys(), (Keys{"A-inventory", "A-payment", "A-capture"}));
  EXPECT_EQ(r.calls[0].body, (nlohmann::json{{"items", kOrder["items"]}}));
  EXPECT_EQ(r.calls[1].body.value("three_d_secure", false), true);
  EXPECT_EQ(r.calls[2].path, "/v1/captures");
  EXPECT_EQ(r.calls[2].body.value("charge_id", ""), "ch_0123456789abcdef0123456789abcdef");
  EXPECT_GE(r.calls[2].at, 2min);
  EXPECT_EQ(r.status, 201);
  EXPECT_EQ(r.body.value("reservation_id", ""), "res_0123456789abcdef0123456789abcdef");

  auto crashes = kit::CheckCrashes(PlaceOrder, kOrder, ThreeDSecure());
  EXPECT_GT(crashes.points, 5);
  EXPECT_TRUE(crashes.differences.empty())
      << crashes.differences[0].where << ": " << crashes.differences[0].difference;
  EXPECT_TRUE(kit::CheckDeterministic(PlaceOrder, kOrder, ThreeDSecure()).empty());
}

// Branches run on threads of their own, so which is sent first varies from run to run; an
// order that completes ends the same whichever it is.
TEST(TestingKit, TheParallelPlaceOrderEndsTheSameAfterACrashAtEveryPoint) {
  auto parallel = [](idemsaga::Participants& p) -> std::optional<Definition> {
    return idemsaga::steps::MakePlaceOrderParallelSaga(p.Get("inventory"), p.Get("payment"));
  };
  auto o = ThreeDSecure();
  auto setup = o.setup;
  o.setup = [setup](kit::Environment& env) {
    setup(env);
    env.participants()
        .Add("inventory")
        .Script("A-inventory", {Reply::Retryable(), Reply::Success().After(50ms)});
  };
  auto crashes = kit::CheckCrashes(parallel, kOrder, o);
  EXPECT_EQ(crashes.reference.end, kit::End::kCompleted);
  EXPECT_EQ(crashes.reference.CallsOf("A-capture").size(), 1U);
  EXPECT_GT(crashes.points, 4);
  EXPECT_TRUE(crashes.differences.empty())
      << crashes.differences[0].where << ": " << crashes.differences[0].difference;
}

TEST(TestingKit, APlaceOrderRefusedByThePaymentReleasesTheStock) {
  kit::CheckOptions o;
  o.setup = [](kit::Environment& env) {
    env.participants().Add("inventory");
    env.participants().Add("payment").Script(
        "A-payment", {Reply::Refusal(402, "card_declined", "the card was declined")});
  };
  auto r = kit::Run(PlaceOrder, kOrder, o);
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.status, 402);
  EXPECT_EQ(r.body.value("code", ""), "card_declined");
  EXPECT_EQ(r.CallKeys(), (Keys{"A-inventory", "A-payment", "A-inventory-compensate"}));
  EXPECT_EQ(r.CallsOf("A-inventory-compensate")[0].path, "/v1/reservations/release");
}

// deliver_order: place_order as a child (its 3-D Secure wait parks the parent), then an
// operator's approval that refuses: the child is compensated, its steps in reverse.
TEST(TestingKit, RunsTheShippedDeliverOrderSagaWithAChildAndTwoWaitsAndSurvivesCrashes) {
  auto deliver = [](idemsaga::Participants& p) -> std::optional<Definition> {
    return idemsaga::steps::MakeDeliverOrderSaga(p);
  };
  kit::CheckOptions o;
  o.setup = [](kit::Environment& env) {
    env.participants()
        .Add("inventory")
        .DefaultOutput({{"reservation_id", "res_0123456789abcdef0123456789abcdef"}});
    env.participants().Add("payment").Script(
        "A-order-payment", {Reply::Success({{"charge_id", "ch_0123456789abcdef0123456789abcdef"},
                                            {"status", "requires_action"}})});
    env.participants().Add("shipping");
    env.SendAfter(2min, "payment_confirmed");
    env.SendAfter(3h, "order_rejected", {{"by", "ops"}, {"reason", "too large"}});
  };
  nlohmann::json input = {{"order", kOrder},
                          {"address",
                           {{"name", "Ada Lovelace"},
                            {"line1", "12 St James's Square"},
                            {"city", "London"},
                            {"postal_code", "SW1Y 4JH"},
                            {"country", "GB"}}}};
  input["order"]["amount_cents"] = 600000;  // over the approval limit
  auto r = kit::Run(deliver, input, o);
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.status, 422);
  EXPECT_EQ(r.body.value("code", ""), "order_rejected");
  EXPECT_EQ(r.CallKeys(), (Keys{"A-order-inventory", "A-order-payment", "A-order-capture",
                                "A-order-capture-compensate", "A-order-payment-compensate",
                                "A-order-inventory-compensate"}));
  EXPECT_EQ(r.compensated, (Keys{"order"}));
  EXPECT_GE(r.CallsOf("A-order-capture-compensate")[0].at, 3h);

  auto crashes = kit::CheckCrashes(deliver, input, o);
  EXPECT_GT(crashes.points, 8);
  for (const auto& d : crashes.differences) {
    ADD_FAILURE() << "point " << d.point << " (" << d.where << "): " << d.difference;
  }
}

// The README's "Test your sagas" example: the trip saga of examples/trip_booking (a hotel,
// then a car), tested as a team would test it.
struct TripInput {
  std::string city;
};

Definition MakeTripSaga(idemsaga::Participants& participants) {
  auto& hotel = participants.Get("hotel");
  auto& car = participants.Get("car");
  return std::move(
      Definition("trip", 1)
          .Input<TripInput>([](const nlohmann::json& body) {
            idemsaga::Fields f(body);
            TripInput trip{f.Text("city", 64)};
            f.Done();
            return trip;
          })
          .Step(
              "hotel",
              [&](StepContext& ctx) {
                return hotel.Post("/v1/bookings", ctx, {{"city", ctx.Input<TripInput>().city}});
              },
              [&](StepContext& ctx) { return hotel.Compensate("/v1/bookings/cancel", ctx); })
          .Step(
              "car",
              [&](StepContext& ctx) {
                return car.Post("/v1/rentals", ctx, {{"city", ctx.Input<TripInput>().city}});
              },
              [&](StepContext& ctx) { return car.Compensate("/v1/rentals/cancel", ctx); }));
}

// [test-your-sagas]
TEST(TripSaga, ACarThatCannotBeHadCancelsTheHotel) {
  namespace kit = idemsaga::testing;
  kit::Environment env;
  env.participants().Add("hotel");
  env.participants().Add("car").Script("A-car", {kit::Reply::Refusal(409, "sold_out")});
  idemsaga::Definition trip = MakeTripSaga(env.participants());
  kit::Result r = env.Run(trip, {{"city", "Oslo"}});
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.CallKeys(), (std::vector<std::string>{"A-hotel", "A-car", "A-hotel-compensate"}));
}

TEST(TripSaga, EndsTheSameAfterACrashAnywhereAndSendsTheSameRequestsEveryTime) {
  namespace kit = idemsaga::testing;
  kit::CheckOptions options;
  options.setup = [](kit::Environment& env) {
    env.participants().Add("hotel").Script(
        "A-hotel", {kit::Reply::Retryable(std::chrono::seconds(30)), kit::Reply::Success()});
    env.participants().Add("car");
  };
  nlohmann::json oslo = {{"city", "Oslo"}};
  kit::CrashReport crashes = kit::CheckCrashes(MakeTripSaga, oslo, options);
  for (const auto& d : crashes.differences) ADD_FAILURE() << d.where << ": " << d.difference;
  EXPECT_TRUE(kit::CheckDeterministic(MakeTripSaga, oslo, options).empty());
}
// [test-your-sagas]

TEST(TestingKit, AnInputThatDoesNotParseThrowsAsTheRouteWouldRefuseIt) {
  kit::Environment env;
  env.participants().Add("inventory");
  env.participants().Add("payment");
  auto d = *PlaceOrder(env.participants());
  EXPECT_THROW(env.Run(d, {{"nope", 1}}), idemsaga::InvalidInput);
}

}  // namespace
