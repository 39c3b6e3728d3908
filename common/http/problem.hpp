// Error bodies as RFC 9457 problem details (application/problem+json), one builder for every
// service:
//   {"type":"https://idemsaga.dev/problems/card_declined","title":"Card declined",
//    "status":402,"detail":"the card was declined","code":"card_declined", ...extra}
// `type` is a stable URI per code (docs/errors.md lists them), `code` the same name for
// machines, `title` the same for every occurrence of a code. Extra members (the failed
// `step`, `compensated`, ...) sit beside them. ProblemAnswer is the whole answer (status,
// body, headers) and holds the one Retry-After rule. Pure functions; thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "common/failure.hpp"
#include "common/placement.hpp"

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

// An HTTP answer as data (status, headers, body), before any wire carries it: what a route
// sends (SetAnswer), what the AMQP intake replies, and what the orchestrator builds, stores
// and replays as a run's final answer. The one name for it; the types that look alike differ:
// steps::guard::Response adds what the guard did (outcome, replayed), the step client's
// HttpExchange what the transport did, store::FinishedAnswer which request an answer belongs
// to, and idemsaga::Response is the public API's own.
struct Answer {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::map<std::string, std::string> headers;  // besides Content-Type
};
// An answer as a store keeps it (the parent row, the finished-answer cache): Content-Type among
// its headers, replayed as they were. StoredAnswer reads it back (no Content-Type stored:
// application/json).
std::map<std::string, std::string> StoredHeaders(const Answer& answer);
Answer StoredAnswer(int status, std::string body,
                    const std::map<std::string, std::string>& headers);
// The one Retry-After rule: an answer that asks its caller to come back says when. A 503 (an
// outage), a 429 (too many requests) and a 409 idempotency_key_in_progress (a duplicate still
// running) carry `Retry-After: N` (whole seconds; N is the answerer's, 1 when it knows no
// better); no other answer does (a 500 is not promised to heal: docs/errors.md).
bool CarriesRetryAfter(int status, std::string_view code);
inline constexpr std::chrono::seconds kRetryAfter{1};  // when the answerer knows no better

// The problem answer, every service's one builder (SetError's, the guard's, the use cases'):
// the problem body, its content type, and Retry-After by the rule above (`retry_after`, where
// the rule asks for it).
Answer ProblemAnswer(int status, std::string_view code, std::string_view detail,
                     std::chrono::seconds retry_after = kRetryAfter);
// What a failure is answered (SetFailure's): an outage is 503 `unavailable` + Retry-After; a
// value the database refused, or a defect, a 500.
Answer FailureAnswer(const ClassifiedFailure& failure);
// 503 `unavailable` + Retry-After (SetUnavailable's): a retry with the same key is safe.
Answer UnavailableAnswer(const std::string& what, std::chrono::seconds retry_after = kRetryAfter);

// A tenant this cluster does not serve now (common::pg::Placement): 503 `unavailable` +
// Retry-After, naming the cluster it is placed on (kTenantClusterHeader) when there is one.
Answer MisplacedAnswer(const Misplaced& refusal);

// The code and detail of an error body, a problem (`code`, `detail`); {"", ""} for anything
// else.
std::pair<std::string, std::string> ErrorOf(const nlohmann::json& body);

}  // namespace idemsaga::common::http
