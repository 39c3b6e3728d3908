// Error bodies as RFC 9457 problem details (application/problem+json), one builder for every
// service:
//   {"type":"https://idemsaga.dev/problems/card_declined","title":"Card declined",
//    "status":402,"detail":"the card was declined","code":"card_declined", ...extra}
// `type` is a stable URI per code (docs/errors.md lists them), `code` the same name for
// machines, `title` the same for every occurrence of a code. Extra members (the failed
// `step`, `compensated`, ...) sit beside them.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "common/failure.hpp"

namespace idemsaga::common::http {

inline constexpr const char* kProblemContentType = "application/problem+json";
inline constexpr const char* kProblemTypeBase = "https://idemsaga.dev/problems/";

// The problem object; `extra`'s members are added unless they would replace a standard one.
nlohmann::json Problem(int status, std::string_view code, std::string_view detail,
                       const nlohmann::json& extra = nlohmann::json::object());
std::string ProblemBody(int status, std::string_view code, std::string_view detail,
                        const nlohmann::json& extra = nlohmann::json::object());
// "Card declined" for card_declined: the code's words, or a fixed title for the codes that
// have one.
std::string ProblemTitle(std::string_view code);

// An answer as data, before any wire carries it: what a route sends (SetAnswer) and what the
// AMQP intake replies, built once for both.
struct Answer {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::map<std::string, std::string> headers;  // besides Content-Type
};
// The problem answer (SetError's).
Answer ProblemAnswer(int status, std::string_view code, std::string_view detail);
// What a failure is answered (SetFailure's): an outage is 503 `unavailable` + Retry-After; a
// value the database refused, or a defect, a 500.
Answer FailureAnswer(const ClassifiedFailure& failure);
// 503 `unavailable` + Retry-After (SetUnavailable's): a retry with the same key is safe.
Answer UnavailableAnswer(const std::string& what);

// The code and detail of an error body, a problem (`code`, `detail`); {"", ""} for anything
// else.
std::pair<std::string, std::string> ErrorOf(const nlohmann::json& body);

}  // namespace idemsaga::common::http
