#include "common/http/problem.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace idemsaga::common::http {
namespace {

// Titles where the code's words would read badly; every other code titles itself.
constexpr std::array<std::pair<std::string_view, std::string_view>, 6> kTitles{{
    {"invalid_json", "Invalid JSON"},
    {"idempotency_key_missing", "Idempotency-Key missing"},
    {"idempotency_key_invalid", "Idempotency-Key invalid"},
    {"idempotency_key_reused", "Idempotency-Key reused with another request"},
    {"idempotency_key_in_progress", "A request with this Idempotency-Key is in progress"},
    {"unavailable", "Service unavailable"},
}};

}  // namespace

std::string ProblemTitle(std::string_view code) {
  for (const auto& [c, title] : kTitles) {
    if (c == code) return std::string(title);
  }
  std::string title(code);
  for (char& ch : title) {
    if (ch == '_') ch = ' ';
  }
  if (!title.empty())
    title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
  return title;
}

nlohmann::json Problem(int status, std::string_view code, std::string_view detail,
                       const nlohmann::json& extra) {
  nlohmann::json p = {{"type", std::string(kProblemTypeBase) + std::string(code)},
                      {"title", ProblemTitle(code)},
                      {"status", status},
                      {"detail", detail},
                      {"code", code}};
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (!p.contains(it.key())) p[it.key()] = it.value();
    }
  }
  return p;
}

std::string ProblemBody(int status, std::string_view code, std::string_view detail,
                        const nlohmann::json& extra) {
  return Problem(status, code, detail, extra).dump();
}

bool CarriesRetryAfter(int status, std::string_view code) {
  return status == 503 || status == 429 || (status == 409 && code == "idempotency_key_in_progress");
}

Answer ProblemAnswer(int status, std::string_view code, std::string_view detail,
                     std::chrono::seconds retry_after) {
  Answer a{status, ProblemBody(status, code, detail), kProblemContentType, {}};
  if (CarriesRetryAfter(status, code)) {
    a.headers["Retry-After"] = std::to_string(std::max<long long>(0, retry_after.count()));
  }
  return a;
}

Answer UnavailableAnswer(const std::string& what, std::chrono::seconds retry_after) {
  return ProblemAnswer(503, "unavailable", what + "; retrying with the same key is safe",
                       retry_after);
}

Answer MisplacedAnswer(const Misplaced& refusal) {
  auto a = UnavailableAnswer(refusal.what());
  if (!refusal.cluster().empty()) a.headers[kTenantClusterHeader] = refusal.cluster();
  return a;
}

Answer FailureAnswer(const ClassifiedFailure& failure) {
  switch (failure.kind) {
    case Failure::kUnavailable:
      return UnavailableAnswer("the database is unavailable");
    case Failure::kRejectedValue:
      // Not an outage: the same request would fail the same way, so no Retry-After and no
      // promise that a retry helps. Nothing was stored (the transaction rolled back).
      return ProblemAnswer(500, "internal_error",
                           "the database refused a value of this request (SQLSTATE " +
                               failure.sqlstate +
                               "); nothing was stored, and sending it again fails the same way");
    case Failure::kDefect:
      break;
  }
  return ProblemAnswer(500, "internal_error", "internal error; retrying with the same key is safe");
}

std::map<std::string, std::string> StoredHeaders(const Answer& answer) {
  auto headers = answer.headers;
  headers["Content-Type"] = answer.content_type;
  return headers;
}

Answer StoredAnswer(int status, std::string body,
                    const std::map<std::string, std::string>& headers) {
  Answer a;
  a.status = status;
  a.body = std::move(body);
  for (const auto& [name, value] : headers) {
    if (name == "Content-Type") {
      a.content_type = value;
    } else {
      a.headers[name] = value;
    }
  }
  return a;
}

std::pair<std::string, std::string> ErrorOf(const nlohmann::json& body) {
  if (!body.is_object()) return {"", ""};
  auto text = [](const nlohmann::json& j, const char* name) {
    auto it = j.find(name);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (body.contains("code") && body["code"].is_string()) {
    return {text(body, "code"), text(body, "detail")};
  }
  return {"", ""};
}

}  // namespace idemsaga::common::http
