// The trip saga under idemsaga's test kit: the engine itself, scripted participants and a
// virtual clock; no database, no network, milliseconds.
#include <gtest/gtest.h>

#include <idemsaga/testing.hpp>

#include "trip_saga.hpp"

using trip::MakeTripSaga;

// [test-your-sagas]
TEST(TripSaga, ACarThatCannotBeHadCancelsTheHotel) {
  namespace kit = idemsaga::testing;
  kit::Environment env;
  env.participants().Add("hotel");
  env.participants().Add("car").Script("A-car", {kit::Reply::Refusal(422, "no_cars")});
  idemsaga::Definition trip = MakeTripSaga(env.participants());
  kit::Result r = env.Run(trip, {{"city", "Atlantis"}});
  EXPECT_EQ(r.end, kit::End::kFailed);
  EXPECT_EQ(r.status, 422);
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
