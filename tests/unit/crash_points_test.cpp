// The stock binary's crash points (cmd/idemsaga/crash_points.hpp): the hook kills the process
// at the Nth time a named point is reached, and an empty spec installs no hook at all.
#include "cmd/idemsaga/crash_points.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>

namespace {

using idemsaga::cmd::CrashPoints;

TEST(CrashPoints, AnEmptySpecInstallsNoHook) {
  EXPECT_FALSE(CrashPoints(""));
  EXPECT_FALSE(CrashPoints(","));
}

TEST(CrashPointsDeathTest, KillsWithSigkillTheNthTimeItsPointIsReached) {
  EXPECT_EXIT(
      {
        auto hook = CrashPoints("after_claim,between_compensations@3");
        hook("after_step_sent");  // not armed
        hook("between_compensations");
        hook("between_compensations");
        std::fprintf(stderr, "still alive after two\n");
        hook("between_compensations");
        std::fprintf(stderr, "not reached\n");
      },
      ::testing::KilledBySignal(SIGKILL), "still alive after two");
}

TEST(CrashPointsDeathTest, KillsAtTheFirstHitWithoutACount) {
  EXPECT_EXIT(CrashPoints("after_finish")("after_finish"), ::testing::KilledBySignal(SIGKILL), "");
}

}  // namespace
