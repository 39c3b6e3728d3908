// The one table from the wire to what the runner does next.
#include "steps/client/participant_client.hpp"

#include <gtest/gtest.h>

#include "common/http/problem.hpp"

namespace {

using saga::Outcome;
using steps::client::HttpExchange;
using steps::client::MapOutcome;
using T = HttpExchange::Transport;

struct Row {
  const char* name;
  HttpExchange exchange;
  Outcome expected;
};

TEST(MapOutcome, MapsEveryKindOfAnswerToWhatTheRunnerShouldDo) {
  const std::string busy = R"({"error":{"code":"idempotency_key_in_progress","message":"m"}})";
  const std::string stock = R"({"error":{"code":"insufficient_stock","message":"m"}})";
  std::vector<Row> table = {
      {"connect refused", {T::kNotConnected, 0, "", false, "Connection"}, Outcome::kRetryable},
      {"read timeout after sending", {T::kNoAnswer, 0, "", false, "Read"}, Outcome::kInDoubt},
      {"dropped after sending", {T::kNoAnswer, 0, "", false, "Write"}, Outcome::kInDoubt},
      {"201", {T::kAnswered, 201, R"({"charge_id":"ch_1"})"}, Outcome::kSucceeded},
      {"200 replayed", {T::kAnswered, 200, "{}", true}, Outcome::kSucceeded},
      {"2xx not json", {T::kAnswered, 200, "<html>"}, Outcome::kInDoubt},
      {"409 in progress", {T::kAnswered, 409, busy}, Outcome::kRetryable},
      {"409 insufficient stock", {T::kAnswered, 409, stock}, Outcome::kTerminal},
      {"409 cancelled",
       {T::kAnswered, 409, R"({"error":{"code":"cancelled"}})"},
       Outcome::kTerminal},
      {"402 declined",
       {T::kAnswered, 402, R"({"error":{"code":"card_declined"}})"},
       Outcome::kTerminal},
      {"409 compensated (a late retry of an undone action)",
       {T::kAnswered, 409, R"({"error":{"code":"compensated"}})"},
       Outcome::kTerminal},
      // Not business answers: configuration and protocol faults wait for a fix.
      {"402 with a code the participant never declared",
       {T::kAnswered, 402, R"({"error":{"code":"mystery"}})"},
       Outcome::kBlocked},
      {"422 reused",
       {T::kAnswered, 422, R"({"error":{"code":"idempotency_key_reused"}})"},
       Outcome::kBlocked},
      {"400 bad request", {T::kAnswered, 400, "{}"}, Outcome::kBlocked},
      {"401 wrong service token",
       {T::kAnswered, 401, R"({"error":{"code":"unauthorized"}})"},
       Outcome::kBlocked},
      {"404 wrong URL",
       {T::kAnswered, 404, R"({"error":{"code":"not_found"}})"},
       Outcome::kBlocked},
      {"405", {T::kAnswered, 405, ""}, Outcome::kBlocked},
      {"408", {T::kAnswered, 408, ""}, Outcome::kBlocked},
      {"413", {T::kAnswered, 413, R"({"error":{"code":"payload_too_large"}})"}, Outcome::kBlocked},
      {"415", {T::kAnswered, 415, ""}, Outcome::kBlocked},
      {"3xx", {T::kAnswered, 302, ""}, Outcome::kBlocked},
      {"429", {T::kAnswered, 429, ""}, Outcome::kRetryable},
      {"500", {T::kAnswered, 500, ""}, Outcome::kRetryable},
      {"503", {T::kAnswered, 503, R"({"error":{"code":"unavailable"}})"}, Outcome::kRetryable},
  };
  for (const auto& row : table) {
    EXPECT_EQ(MapOutcome(row.exchange, {"insufficient_stock", "card_declined"}).outcome,
              row.expected)
        << row.name;
  }
}

TEST(MapOutcome, HonoursTheParticipantsRetryAfterInSecondsCappedAtAMinute) {
  auto busy = [](std::string retry_after) {
    HttpExchange x{T::kAnswered, 503, "", false, "", std::move(retry_after)};
    return MapOutcome(x).retry_after;
  };
  EXPECT_EQ(busy("3"), std::chrono::seconds(3));
  EXPECT_EQ(busy("0"), std::chrono::seconds(0));
  EXPECT_EQ(busy("86400"), std::chrono::seconds(60));
  EXPECT_EQ(busy(""), std::chrono::seconds(0));
  EXPECT_EQ(busy("Wed, 21 Oct 2015 07:28:00 GMT"), std::chrono::seconds(0));
  EXPECT_EQ(busy("-1"), std::chrono::seconds(0));
}

TEST(MapOutcome, KeepsTheParticipantsErrorCodeStatusAndReplayFlag) {
  auto declined =
      MapOutcome({T::kAnswered, 402, R"({"error":{"code":"card_declined","message":"declined!"}})"},
                 {"card_declined"});
  EXPECT_EQ(declined.http_status, 402);
  EXPECT_EQ(declined.error_code, "card_declined");
  EXPECT_EQ(declined.detail, "declined!");
  // A participant's problem (RFC 9457) reads the same; the old form above is what answers
  // stored before 0.2 replay.
  auto problem = MapOutcome(
      {T::kAnswered, 402,
       common::http::ProblemBody(402, "card_declined", "declined!", {{"error", "decoy"}})},
      {"card_declined"});
  EXPECT_EQ(problem.outcome, saga::Outcome::kTerminal);
  EXPECT_EQ(problem.error_code, "card_declined");
  EXPECT_EQ(problem.detail, "declined!");
  auto busy = MapOutcome(
      {T::kAnswered, 409, common::http::ProblemBody(409, "idempotency_key_in_progress", "later")});
  EXPECT_EQ(busy.outcome, saga::Outcome::kRetryable);
  auto ok = MapOutcome({T::kAnswered, 201, R"({"charge_id":"ch_1"})", true});
  EXPECT_TRUE(ok.replayed);
  EXPECT_EQ(ok.output["charge_id"], "ch_1");
}

}  // namespace
