// Every problem `code` a service can emit, collected from the source (not listed by hand), is
// documented: in docs/errors.md's table with its status, and in the OpenAPI document of every
// service whose code emits it, on a response of that status.
//
// A code is found where the code answers one: a status and a code literal side by side
// (`SetError(res, 409, "not_retryable", ...)`, `Json(kInProgressStatus, "...")`,
// `Refuse({431, "..."})`, the guard's code table `{GuardCode::kCancelled, 409, "cancelled"}`), a
// bare status's table (`case 404: return {"not_found", ...}`), a key parser's verdict
// (`ParsedKey{"", "idempotency_key_missing", ...}`, a 400), and a failed step's `<step>` +
// "_unavailable" (a 502).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "common/http/openapi.hpp"
#include "common/http/problem.hpp"

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = IDEMSAGA_SOURCE_DIR;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The source without its // comments (which quote answers as examples).
std::string Code(const fs::path& path) {
  std::string out;
  std::istringstream in(Slurp(path));
  for (std::string line; std::getline(in, line);) {
    auto trimmed = line.find_first_not_of(' ');
    if (trimmed != std::string::npos && line.compare(trimmed, 2, "//") == 0) continue;
    out += line + "\n";
  }
  return out;
}

struct Emitted {
  std::string code;
  int status;
  fs::path file;  // relative to the root
};

std::vector<fs::path> Sources() {
  std::vector<fs::path> out;
  for (const char* dir : {"common", "orchestrator", "steps", "demo"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      auto ext = e.path().extension();
      if (ext == ".cpp" || ext == ".hpp") out.push_back(fs::relative(e.path(), kRoot));
    }
  }
  return out;
}

std::vector<Emitted> EmittedCodes() {
  std::map<std::string, int> constants;               // kInProgressStatus = 409
  std::map<std::string, std::string> code_constants;  // kCardDeclined = "card_declined"
  const std::regex constant(R"(\b(k[A-Za-z]+Status)\s*=\s*(\d{3})\b)");
  const std::regex code_constant(R"re(\b(k[A-Za-z]+)\s*=\s*"([a-z][a-z0-9_]*)")re");
  for (const auto& file : Sources()) {
    std::string text = Code(kRoot / file);
    for (std::sregex_iterator it(text.begin(), text.end(), constant), end; it != end; ++it) {
      constants[(*it)[1]] = std::stoi((*it)[2]);
    }
    for (std::sregex_iterator it(text.begin(), text.end(), code_constant), end; it != end; ++it) {
      code_constants[(*it)[1]] = (*it)[2];
    }
  }
  std::vector<Emitted> out;
  const std::regex beside(R"(\b(\d{3}|k[A-Za-z]+Status)\s*,\s*"([a-z][a-z0-9_]*)\")");
  const std::regex table(R"(case (\d{3}):\s*return \{"([a-z][a-z0-9_]*)\")");
  const std::regex key_verdict(R"(ParsedKey\{"",\s*"([a-z][a-z0-9_]*)\")");
  const std::regex step_suffix(R"(failed_step \+ "(_[a-z][a-z0-9_]*)\")");
  // Problem(409, kInsufficientStock, ...): a code named by a constant of its own.
  const std::regex beside_constant(R"(\b(\d{3})\s*,\s*(k[A-Za-z]+)\b)");
  for (const auto& file : Sources()) {
    std::string text = Code(kRoot / file);
    for (std::sregex_iterator it(text.begin(), text.end(), beside), end; it != end; ++it) {
      std::string status = (*it)[1];
      int n = std::isdigit(static_cast<unsigned char>(status[0])) ? std::stoi(status)
                                                                  : constants[status];
      if (n >= 400) out.push_back({(*it)[2], n, file});
    }
    for (std::sregex_iterator it(text.begin(), text.end(), table), end; it != end; ++it) {
      out.push_back({(*it)[2], std::stoi((*it)[1]), file});
    }
    for (std::sregex_iterator it(text.begin(), text.end(), key_verdict), end; it != end; ++it) {
      out.push_back({(*it)[1], 400, file});
    }
    for (std::sregex_iterator it(text.begin(), text.end(), beside_constant), end; it != end; ++it) {
      auto named = code_constants.find((*it)[2]);
      int n = std::stoi((*it)[1]);
      if (named != code_constants.end() && n >= 400) out.push_back({named->second, n, file});
    }
    for (std::sregex_iterator it(text.begin(), text.end(), step_suffix), end; it != end; ++it) {
      out.push_back({"<step>" + (*it)[1].str(), 502, file});
    }
  }
  return out;
}

// The services whose OpenAPI documents must name a code emitted from `file`.
std::set<std::string> ServicesOf(const fs::path& file) {
  const std::set<std::string> participants = {"inventory", "payment", "shipping"};
  std::string f = file.string();
  if (f.rfind("common/", 0) == 0) return {"orchestrator", "inventory", "payment", "shipping"};
  if (f.rfind("orchestrator/", 0) == 0 || f.rfind("steps/saga/", 0) == 0) return {"orchestrator"};
  if (f.rfind("steps/guard/", 0) == 0 || f.rfind("steps/protocol/", 0) == 0) return participants;
  if (f.find("inventory") != std::string::npos) return {"inventory"};
  if (f.find("payment") != std::string::npos) return {"payment"};
  if (f.find("shipping") != std::string::npos) return {"shipping"};
  if (f.rfind("demo/", 0) == 0) return participants;
  return {};
}

// A service's OpenAPI text by status: every description of a response of that status (with
// $refs followed), and every "NNN `code`" that an operation's or the document's description
// names.
std::map<int, std::string> DocumentedByStatus(const std::string& service) {
  std::map<int, std::string> out;
  auto read = [](const std::string& name) {
    return nlohmann::json::parse(Slurp(kRoot / "docs/openapi" / (name + ".json")));
  };
  // A participant serves its own document merged into the one every participant shares.
  auto doc = service == "orchestrator"
                 ? read(service)
                 : idemsaga::common::http::MergeOpenApi(read("participant"), read(service));
  {
    auto resolve = [&](nlohmann::json r) {
      while (r.contains("$ref")) {
        r = doc[nlohmann::json::json_pointer(r["$ref"].get<std::string>().substr(1))];
      }
      return r;
    };
    const std::regex named(R"((\d{3}) ((?:`[a-z<>_]+`/?)+))");
    auto name_codes = [&](const std::string& text) {
      for (std::sregex_iterator it(text.begin(), text.end(), named), end; it != end; ++it) {
        out[std::stoi((*it)[1])] += (*it)[2].str() + "\n";
      }
    };
    // What any path answers, said once for the document.
    name_codes(doc["info"].value("description", ""));
    for (const auto& [path, ops] : doc["paths"].items()) {
      for (const auto& [method, op] : ops.items()) {
        if (!op.is_object()) continue;
        const auto responses = op.value("responses", nlohmann::json::object());
        for (const auto& [status, response] : responses.items()) {
          if (!std::isdigit(static_cast<unsigned char>(status[0]))) continue;
          out[std::stoi(status)] += resolve(response).value("description", "") + "\n";
        }
        name_codes(op.value("description", ""));
      }
    }
  }
  return out;
}

TEST(ProblemCodes, TheScanFindsTheCodesEveryLayerEmits) {
  std::set<std::string> found;
  for (const auto& e : EmittedCodes()) found.insert(e.code);
  // One of each way a code is emitted, so that a scan that silently stopped matching fails.
  for (const char* code : {"not_retryable", "idempotency_key_in_progress", "request_timeout",
                           "idempotency_key_missing", "<step>_unavailable", "card_declined",
                           "unsupported_content_encoding", "action_unknown"}) {
    EXPECT_TRUE(found.count(code)) << code;
  }
  EXPECT_GE(found.size(), 25u);
}

TEST(ProblemCodes, EveryEmittedCodeIsInErrorsMdWithItsStatus) {
  std::string errors = Slurp(kRoot / "docs/errors.md");
  for (const auto& e : EmittedCodes()) {
    std::string row = "| `" + e.code + "` | " + std::to_string(e.status) + " |";
    EXPECT_NE(errors.find(row), std::string::npos)
        << e.code << " (" << e.status << ", from " << e.file.string()
        << ") is not in docs/errors.md's table as " << row;
  }
}

TEST(ProblemCodes, EveryEmittedCodeIsInTheOpenApiResponsesOfItsServices) {
  std::map<std::string, std::map<int, std::string>> documented;
  for (const auto& e : EmittedCodes()) {
    for (const auto& service : ServicesOf(e.file)) {
      if (!documented.count(service)) documented[service] = DocumentedByStatus(service);
      EXPECT_NE(documented[service][e.status].find("`" + e.code + "`"), std::string::npos)
          << e.code << " (" << e.status << ", from " << e.file.string() << ") is named by no "
          << e.status << " response of docs/openapi/" << service << ".json";
    }
  }
}

// The one builder's table: which answers carry Retry-After, and with what. Every service's
// problem comes from ProblemAnswer, so this is every problem's rule.
TEST(ProblemCodes, OnlyA503A429AndAnInProgress409CarryRetryAfter) {
  using idemsaga::common::http::ProblemAnswer;
  using std::chrono::seconds;
  struct Row {
    int status;
    const char* code;
    seconds retry_after;
    const char* header;  // nullptr: none
  };
  const Row rows[] = {
      {503, "unavailable", seconds(1), "1"},
      {503, "unavailable", seconds(30), "30"},  // a participant's own (demo fault injection)
      {429, "too_many_requests", seconds(2), "2"},
      {409, "idempotency_key_in_progress", seconds(7), "7"},  // the lease left
      {409, "not_retryable", seconds(1), nullptr},
      {409, "cancelled", seconds(1), nullptr},
      {422, "idempotency_key_reused", seconds(1), nullptr},
      {400, "invalid_request", seconds(1), nullptr},
      {402, "card_declined", seconds(1), nullptr},
      {500, "internal_error", seconds(1), nullptr},  // no promise that a retry heals it
      {502, "payment_unavailable", seconds(1), nullptr},
  };
  for (const auto& r : rows) {
    auto a = ProblemAnswer(r.status, r.code, "d", r.retry_after);
    SCOPED_TRACE(std::to_string(r.status) + " " + r.code);
    EXPECT_EQ(a.status, r.status);
    EXPECT_EQ(a.content_type, "application/problem+json");
    EXPECT_EQ(a.body, idemsaga::common::http::ProblemBody(r.status, r.code, "d"));
    EXPECT_EQ(a.headers.count("Retry-After"), r.header != nullptr ? 1u : 0u);
    if (r.header != nullptr) EXPECT_EQ(a.headers.at("Retry-After"), r.header);
    EXPECT_EQ(a.headers.size(), a.headers.count("Retry-After"));  // nothing else
  }
  // The bytes every service has always sent for one of them.
  EXPECT_EQ(ProblemAnswer(503, "unavailable", "down").body,
            R"({"code":"unavailable","detail":"down","status":503,)"
            R"("title":"Service unavailable","type":"https://idemsaga.dev/problems/unavailable"})");
}

}  // namespace
