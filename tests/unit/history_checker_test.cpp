// The chaos tier's history checker (tests/chaos/history.hpp) on crafted histories: a clean one
// passes, and each rule fails on a history that breaks it, so that a 0 in a partition
// scenario's figures means something.
#include <gtest/gtest.h>

#include <thread>

#include "tests/chaos/history.hpp"

namespace {

using chaos::CheckHistory;
using chaos::Event;
using chaos::History;
using chaos::KeyId;
using chaos::KeyState;

const std::string kCreated = R"({"status":"completed","order_id":"A","charge_id":"ch_1"})";
const std::string kCreatedOther = R"({"status":"completed","order_id":"A","charge_id":"ch_2"})";
const std::string kDeclined = R"({"status":402,"saga_status":"failed","title":"declined"})";
const std::string kInProgress = R"({"status":409,"title":"in progress"})";

KeyState Completed(const std::string& body = kCreated) {
  return {.status = "completed",
          .stored_status = 201,
          .stored_body = body,
          .reservation_rows = 1,
          .reservations_held = 1,
          .charge_rows = 1,
          .charges_in_force = 1};
}

KeyState Failed() {
  return {.status = "failed",
          .stored_status = 402,
          .stored_body = kDeclined,
          .reservation_rows = 1,
          .reservations_held = 0,
          .charge_rows = 1,
          .charges_in_force = 0};
}

// One client's attempts at one key, each answered as given (status 0: no answer).
void Attempts(History& h, const std::string& key,
              const std::vector<std::pair<int, std::string>>& answers) {
  for (const auto& [status, body] : answers) {
    long long op = h.Invoke("demo", key, "{}");
    if (status == 0) {
      h.Info(op, "Read timeout");
    } else {
      h.Complete(op, status, body);
    }
  }
}

// Key "a": created after a timeout and a 409, then replayed; key "d": declined, replayed.
void Clean(History& h) {
  Attempts(h, "a", {{0, ""}, {409, kInProgress}, {201, kCreated}, {201, kCreated}});
  Attempts(h, "d", {{402, kDeclined}, {402, kDeclined}});
}

std::vector<Event> CleanEvents() {
  History h;
  Clean(h);
  return h.events();
}

std::map<KeyId, KeyState> CleanStates() {
  return {{{"demo", "a"}, Completed()}, {{"demo", "d"}, Failed()}};
}

TEST(HistoryChecker, FindsNothingInAHistoryThatKeepsEveryPromise) {
  auto v = CheckHistory(CleanEvents(), CleanStates());
  EXPECT_EQ(v.Total(), 0) << v.Line();
}

TEST(HistoryChecker, RecordsEveryAttemptAsAnInvokeAndItsAnswerOrAnInfo) {
  History h;
  std::thread other([&] { Attempts(h, "b", {{201, kCreated}}); });
  other.join();
  Attempts(h, "a", {{0, ""}});
  auto events = h.events();
  ASSERT_EQ(events.size(), 4U);
  EXPECT_EQ(events[0].type, Event::Type::kInvoke);
  EXPECT_EQ(events[1].type, Event::Type::kComplete);
  EXPECT_EQ(events[1].key, "b");
  EXPECT_EQ(events[1].status, 201);
  EXPECT_EQ(events[1].body, kCreated);
  EXPECT_EQ(events[3].type, Event::Type::kInfo);
  EXPECT_EQ(events[3].key, "a");
  EXPECT_EQ(events[2].op, events[3].op);
  EXPECT_NE(events[0].client, events[2].client) << "two threads are two clients";
  EXPECT_EQ(events[0].body_hash.size(), 16U);
  EXPECT_LE(events[0].at_us, events[3].at_us);
}

TEST(HistoryChecker, TellsTheFinalAnswersFromTheOnesThatLeaveAKeyOpen) {
  EXPECT_EQ(chaos::SagaOutcome(kCreated), "completed");
  EXPECT_EQ(chaos::SagaOutcome(kDeclined), "failed");
  EXPECT_EQ(chaos::SagaOutcome(kInProgress), "");
  EXPECT_EQ(chaos::SagaOutcome(R"({"status":"running"})"), "");
  EXPECT_EQ(chaos::SagaOutcome("not json"), "");
}

TEST(HistoryChecker, FlagsACreatedOrderWithTwoChargesOrNoReservation) {
  auto states = CleanStates();
  states[{"demo", "a"}].charge_rows = 2;
  EXPECT_EQ(CheckHistory(CleanEvents(), states).created_without_one_effect, 1);
  states = CleanStates();
  states[{"demo", "a"}].reservations_held = 0;
  EXPECT_EQ(CheckHistory(CleanEvents(), states).created_without_one_effect, 1);
}

TEST(HistoryChecker, FlagsAFailedOrderThatStillHoldsACharge) {
  auto states = CleanStates();
  states[{"demo", "d"}].charges_in_force = 1;
  auto v = CheckHistory(CleanEvents(), states);
  EXPECT_EQ(v.failed_with_net_effect, 1) << v.Line();
}

TEST(HistoryChecker, FlagsAReplayWhoseBytesDifferFromTheFirstAnswer) {
  History h;
  Clean(h);
  Attempts(h, "a", {{200, kCreated}});  // same body, another status
  auto v = CheckHistory(h.events(), CleanStates());
  EXPECT_EQ(v.replay_mismatch, 1) << v.Line();
}

TEST(HistoryChecker, FlagsAKeyThatAnsweredTwoDifferentBodies) {
  History h;
  Clean(h);
  Attempts(h, "a", {{201, kCreatedOther}});
  auto v = CheckHistory(h.events(), CleanStates());
  EXPECT_EQ(v.divergent_keys, 1) << v.Line();
  EXPECT_EQ(v.replay_mismatch, 1) << v.Line();
}

TEST(HistoryChecker, FlagsAnAnswerTheDatabaseDoesNotHold) {
  auto states = CleanStates();
  states[{"demo", "a"}].status = "started";  // the 201 was sent, the completion never stored
  auto v = CheckHistory(CleanEvents(), states);
  EXPECT_EQ(v.lost_acks, 2) << v.Line();  // the first answer and its replay
  states = CleanStates();
  states[{"demo", "a"}].stored_body = kCreatedOther;
  EXPECT_EQ(CheckHistory(CleanEvents(), states).lost_acks, 2);
}

TEST(HistoryChecker, FlagsAKeyThatNeverGotAFinalAnswer) {
  History h;
  Clean(h);
  Attempts(h, "open", {{0, ""}, {409, kInProgress}});
  auto v = CheckHistory(h.events(), CleanStates());
  EXPECT_EQ(v.undecided_keys, 1) << v.Line();
}

TEST(HistoryChecker, FlagsEffectsOfAKeyNoClientSent) {
  auto states = CleanStates();
  states[{"demo", "ghost"}] = {.reservation_rows = 1, .reservations_held = 1};
  auto v = CheckHistory(CleanEvents(), states);
  EXPECT_EQ(v.phantom_effects, 1) << v.Line();
}

TEST(HistoryChecker, FlagsAnInvokeWithoutAnswerAndAnAnswerWithoutInvoke) {
  auto events = CleanEvents();
  events.push_back({.type = Event::Type::kInvoke, .op = 100, .tenant = "demo", .key = "a"});
  events.push_back({.type = Event::Type::kComplete, .op = 200, .tenant = "demo", .key = "a"});
  auto v = CheckHistory(events, CleanStates());
  EXPECT_EQ(v.unmatched_events, 2) << v.Line();
}

}  // namespace
