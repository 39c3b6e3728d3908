// Error bodies as RFC 9457 problem details (application/problem+json), one builder for every
// service:
//   {"type":"https://idemsaga.dev/problems/card_declined","title":"Card declined",
//    "status":402,"detail":"the card was declined","code":"card_declined", ...extra}
// `type` is a stable URI per code (docs/errors.md lists them), `code` the same name for
// machines, `title` the same for every occurrence of a code. Extra members (the failed
// `step`, `compensated`, ...) sit beside them.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

namespace common::http {

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

// The code and detail of an error body, a problem (`code`, `detail`); {"", ""} for anything
// else.
std::pair<std::string, std::string> ErrorOf(const nlohmann::json& body);

}  // namespace common::http
