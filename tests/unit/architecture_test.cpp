// The layers of docs/architecture.md, enforced from the `#include "..."` lines of the
// product's sources: a folder includes its own files and the folders its row allows, nothing
// else. The edges that run the wrong way today are listed one by one (file and header) with
// why; a new wrong-way include, or an exception that is gone, fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The layer a path is in: "common/pg" for common/pg/pool.cpp, "steps" for steps/sagas.cpp,
// "include/idemsaga" for a public header as it is included ("idemsaga/saga.hpp").
std::string LayerOf(const std::string& path) {
  if (path.rfind("idemsaga/", 0) == 0) return "include/idemsaga";
  auto first = path.find('/');
  if (first == std::string::npos) return "";
  auto top = path.substr(0, first);
  auto second = path.find('/', first + 1);
  bool nested = top == "common" || top == "steps" || top == "orchestrator" || top == "cmd";
  return nested && second != std::string::npos ? path.substr(0, second) : top;
}

// Layer -> the layers it may include (its own always).
const std::map<std::string, std::set<std::string>> kAllowed = {
    {"common", {}},
    {"common/trace", {"common"}},
    {"common/pg", {"common"}},
    {"common/redis", {"common"}},
    {"common/dynamo", {"common"}},
    {"common/amqp", {"common"}},
    {"common/http", {"common", "common/trace"}},
    {"steps/saga", {"common", "common/trace", "include/idemsaga"}},
    {"steps/protocol", {"common"}},
    {"steps/guard",
     {"common", "common/trace", "common/pg", "common/redis", "common/dynamo", "common/http",
      "common/amqp", "steps/protocol"}},
    {"steps/client",
     {"common", "common/trace", "common/http", "steps/saga", "steps/protocol", "include/idemsaga"}},
    {"steps", {"common", "steps/saga", "steps/client", "include/idemsaga"}},
    {"orchestrator/store", {"common", "common/trace", "common/pg", "steps/saga"}},
    {"orchestrator",
     {"common", "common/trace", "common/pg", "common/http", "steps/saga", "steps/protocol",
      "steps/client", "steps", "orchestrator/store"}},
    {"orchestrator/http",
     {"common", "common/trace", "common/http", "steps/saga", "steps/protocol", "orchestrator",
      "orchestrator/store"}},
    // orchestrator/http for its answers only (answers.hpp, no HTTP types): see below.
    // steps/client for the one mapping of a participant's answer (Interpret), whatever carried
    // it; orchestrator/store for the replies of saga steps over a queue.
    {"orchestrator/amqp",
     {"common", "common/amqp", "common/http", "steps/saga", "steps/client", "orchestrator",
      "orchestrator/store", "orchestrator/http"}},
    {"demo",
     {"common", "common/trace", "common/pg", "common/redis", "common/http", "steps",
      "steps/protocol", "steps/guard"}},
    {"app",
     {"common", "common/trace", "common/pg", "common/redis", "common/dynamo", "common/http",
      "steps/saga", "steps/protocol", "steps/guard", "steps/client", "steps", "orchestrator/store",
      "orchestrator", "orchestrator/amqp", "include/idemsaga"}},
    {"testing", {"common", "common/trace", "steps/saga", "include/idemsaga"}},
    {"cmd/idemsaga",
     {"common", "common/trace", "common/pg", "common/redis", "common/dynamo", "common/http",
      "steps/saga", "steps/protocol", "steps/guard", "steps/client", "steps", "orchestrator/store",
      "orchestrator", "orchestrator/amqp", "demo", "app", "include/idemsaga"}},
};

// "file -> header": why it is allowed for now.
const std::map<std::string, std::string> kKnownExceptions = {
    {"orchestrator/orchestrator.hpp -> orchestrator/http/routes.hpp",
     "the composition root builds the routes"},
    {"orchestrator/orchestrator.cpp -> orchestrator/http/pages.hpp",
     "the composition root serves the pages"},
};

struct Include {
  std::string file, header;
};

// Every `#include "a/b..."` of the product's sources (not tests, benchmarks or examples).
std::vector<Include> ProductIncludes(const fs::path& root) {
  const std::regex include(R"(^\s*#\s*include\s+"([^"]+/[^"]+)\")");
  std::vector<Include> out;
  for (const char* top : {"common", "steps", "orchestrator", "demo", "testing", "app", "cmd"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      auto ext = entry.path().extension();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".hpp")) continue;
      std::ifstream in(entry.path());
      std::string file = fs::relative(entry.path(), root).generic_string();
      std::smatch m;
      for (std::string line; std::getline(in, line);) {
        if (std::regex_search(line, m, include)) out.push_back({file, m[1]});
      }
    }
  }
  return out;
}

// "file -> header" for every include its layer does not allow.
std::set<std::string> WrongWay(const std::vector<Include>& includes) {
  std::set<std::string> out;
  for (const auto& inc : includes) {
    auto from = LayerOf(inc.file), to = LayerOf(inc.header);
    if (to.empty() || from == to) continue;
    auto allowed = kAllowed.find(from);
    if (allowed != kAllowed.end() && allowed->second.count(to) != 0) continue;
    out.insert(inc.file + " -> " + inc.header);
  }
  return out;
}

TEST(Architecture, EveryIncludeRunsDownTheLayersOrIsAKnownException) {
  auto includes = ProductIncludes(IDEMSAGA_SOURCE_DIR);
  ASSERT_GT(includes.size(), 300U) << "the sources were not found";
  auto wrong = WrongWay(includes);
  for (const auto& edge : wrong) {
    EXPECT_TRUE(kKnownExceptions.count(edge) != 0)
        << edge << " runs the wrong way (docs/architecture.md)";
  }
  for (const auto& [edge, why] : kKnownExceptions) {
    EXPECT_TRUE(wrong.count(edge) != 0) << edge << " is gone: remove it from kKnownExceptions";
  }
}

// Folders whose own files must not name an HTTP library's types (an adapter of another wire
// that reaches the use cases directly, not through a request made up for a route), and the
// headers they may take from the HTTP adapter (built as data, no HTTP types in them).
const std::map<std::string, std::set<std::string>> kNoHttp = {
    {"orchestrator/amqp", {"common/http/problem.hpp", "orchestrator/http/answers.hpp"}},
};

// "file -> header" for every HTTP include of a kNoHttp folder: <httplib.h>, or a header of
// common/http or orchestrator/http other than the ones its row lists.
std::set<std::string> HttpIncludes(const fs::path& root) {
  const std::regex include(R"(^\s*#\s*include\s+[<"]([^>"]+)[>"])");
  std::set<std::string> out;
  for (const auto& [folder, allowed] : kNoHttp) {
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      std::string file = fs::relative(entry.path(), root).generic_string();
      std::smatch m;
      for (std::string line; std::getline(in, line);) {
        if (!std::regex_search(line, m, include)) continue;
        std::string header = m[1];
        bool http = header == "httplib.h" || LayerOf(header) == "common/http" ||
                    LayerOf(header) == "orchestrator/http";
        if (http && allowed.count(header) == 0) out.insert(file + " -> " + header);
      }
    }
  }
  return out;
}

TEST(Architecture, TheAmqpIntakeUsesNoHttpTypes) {
  EXPECT_EQ(HttpIncludes(IDEMSAGA_SOURCE_DIR), std::set<std::string>{});
}

// The check itself: a planted <httplib.h> in orchestrator/amqp is caught.
TEST(Architecture, APlantedHttplibIncludeInTheAmqpIntakeIsCaught) {
  auto root = fs::temp_directory_path() / ("arch_test_" + std::to_string(::getpid()));
  fs::create_directories(root / "orchestrator/amqp");
  std::ofstream(root / "orchestrator/amqp/x.cpp")
      << "#include <httplib.h>\n#include \"orchestrator/http/answers.hpp\"\n"
      << "#include \"common/http/server.hpp\"\n";
  auto found = HttpIncludes(root);
  fs::remove_all(root);
  EXPECT_EQ(found, (std::set<std::string>{"orchestrator/amqp/x.cpp -> httplib.h",
                                          "orchestrator/amqp/x.cpp -> common/http/server.hpp"}));
}

TEST(Architecture, EveryProductFolderHasARow) {
  for (const auto& inc : ProductIncludes(IDEMSAGA_SOURCE_DIR)) {
    EXPECT_TRUE(kAllowed.count(LayerOf(inc.file)) != 0) << inc.file << ": a layer of no row";
  }
}

// Where a library (anything but cmd/, the stock binary) could be killed from the environment:
// "file: what it names" for each file that names a crash point's switch or its kill.
std::set<std::string> KillSwitches(const fs::path& root) {
  std::set<std::string> out;
  for (const char* top : {"common", "steps", "orchestrator", "demo", "testing", "app", "include"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (const char* needle :
           {"IDEMSAGA_CRASH_POINTS", "CrashPoint", "crash_points.cpp", "SIGKILL"}) {
        if (text.find(needle) != std::string::npos) {
          out.insert(fs::relative(entry.path(), root).generic_string() + ": " + needle);
        }
      }
    }
  }
  return out;
}

// A team's process links the libraries: nothing in them may kill it at a crash point. The
// engine reports boundaries through idemsaga::steps::saga::Runner::AtBoundary; only cmd/idemsaga
// installs the hook that kills (crash_points.hpp).
TEST(Architecture, NoLibraryCanBeKilledThroughCrashPoints) {
  EXPECT_EQ(KillSwitches(IDEMSAGA_SOURCE_DIR), std::set<std::string>{});
  EXPECT_TRUE(fs::exists(fs::path(IDEMSAGA_SOURCE_DIR) / "cmd/idemsaga/crash_points.cpp"))
      << "the check looks for what crash_points.cpp names: it moved, move the check";
}

// A file past kMaxLines does too many jobs unless it says at its top why it does not: the words
// "over 450 lines" and the reason, in its first comment lines.
constexpr size_t kMaxLines = 450;

std::set<std::string> LongFilesWithoutAReason(const fs::path& root) {
  std::set<std::string> out;
  for (const char* top :
       {"common", "steps", "orchestrator", "demo", "testing", "app", "cmd", "include"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      auto ext = entry.path().extension();
      if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".hpp")) continue;
      std::ifstream in(entry.path());
      size_t lines = 0;
      bool reason = false;
      for (std::string line; std::getline(in, line); ++lines) {
        if (lines < 10 && line.find("over 450 lines") != std::string::npos) reason = true;
      }
      if (lines > kMaxLines && !reason) {
        out.insert(fs::relative(entry.path(), root).generic_string() + ": " +
                   std::to_string(lines) + " lines");
      }
    }
  }
  return out;
}

TEST(Architecture, NoSourceFileIsOver450LinesWithoutAReasonAtItsTop) {
  EXPECT_EQ(LongFilesWithoutAReason(IDEMSAGA_SOURCE_DIR), std::set<std::string>{});
}

// The check itself: a planted include from the engine into the database layer is caught.
TEST(Architecture, APlantedWrongWayIncludeIsCaught) {
  EXPECT_EQ(WrongWay({{"steps/saga/runner.cpp", "common/pg/pool.hpp"}}),
            std::set<std::string>{"steps/saga/runner.cpp -> common/pg/pool.hpp"});
  EXPECT_EQ(WrongWay({{"common/log.cpp", "orchestrator/store/parent_store.hpp"}}).size(), 1U);
  EXPECT_TRUE(WrongWay({{"steps/saga/runner.cpp", "common/trace/span.hpp"}}).empty());
  // The test kit is built on the engine alone: no database, no HTTP, no orchestrator.
  EXPECT_EQ(WrongWay({{"testing/testing.cpp", "orchestrator/response.hpp"}}).size(), 1U);
  EXPECT_EQ(WrongWay({{"testing/testing.cpp", "common/pg/pool.hpp"}}).size(), 1U);
  EXPECT_TRUE(WrongWay({{"testing/testing.cpp", "idemsaga/testing.hpp"},
                        {"testing/testing.cpp", "steps/saga/runner.hpp"}})
                  .empty());
}

// Namespaces follow folders (docs/architecture.md): a product file's named namespaces are
// idemsaga::<its folder, '/' as '::', a folder named idemsaga dropped> or nested in it; a file
// that defines the public API (it or its header includes "idemsaga/...") may open `idemsaga`.
namespace namespaces {

std::string Expected(const std::string& file) {
  std::string out = "idemsaga";
  std::string dir = std::filesystem::path(file).parent_path().generic_string();
  for (size_t start = 0; start < dir.size();) {
    size_t end = dir.find('/', start);
    if (end == std::string::npos) end = dir.size();
    std::string part = dir.substr(start, end - start);
    if (!part.empty() && part != "idemsaga") out += "::" + part;
    start = end + 1;
  }
  return out;
}

// The text with comments, string and character literals blanked (line breaks kept), so that
// only code's braces and `namespace` words are read.
std::string CodeOnly(const std::string& text) {
  std::string out = text;
  const std::regex raw(R"re(R"([^(\s]*)\()re");
  for (size_t i = 0; i < out.size();) {
    auto blank = [&](size_t from, size_t to) {
      for (size_t k = from; k < to && k < out.size(); ++k) {
        if (out[k] != '\n') out[k] = ' ';
      }
      return to;
    };
    if (out.compare(i, 2, "//") == 0) {
      i = blank(i, out.find('\n', i));
    } else if (out.compare(i, 2, "/*") == 0) {
      size_t end = out.find("*/", i + 2);
      i = blank(i, end == std::string::npos ? out.size() : end + 2);
    } else if (out[i] == 'R' && i + 1 < out.size() && out[i + 1] == '"') {
      std::smatch m;
      std::string rest = out.substr(i, 40);
      if (std::regex_search(rest, m, raw) && m.position(0) == 0) {
        size_t end = out.find(")" + m[1].str() + "\"", i);
        i = blank(i, end == std::string::npos ? out.size() : end + m[1].length() + 2);
      } else {
        ++i;
      }
    } else if (out[i] == '"' ||
               (out[i] == '\'' &&
                (i == 0 || !std::isalnum(static_cast<unsigned char>(out[i - 1]))))) {
      char quote = out[i];
      size_t k = i + 1;
      while (k < out.size() && out[k] != quote && out[k] != '\n') k += out[k] == '\\' ? 2 : 1;
      i = blank(i, k + 1);
    } else {
      ++i;
    }
  }
  return out;
}

// "file: namespace (want ...)" for every named namespace a file opens outside its folder's.
// std and nlohmann are reopened only to specialise their templates.
std::vector<std::string> Misplaced(const std::string& file, const std::string& source,
                                   bool public_api) {
  const std::string text = CodeOnly(source);
  const std::regex opener(R"((?:^|\n)[ \t]*namespace[ \t]+([A-Za-z_][A-Za-z0-9_:]*)?[ \t]*\{)");
  const std::string want = Expected(file);
  std::vector<std::string> out;
  std::vector<std::pair<std::string, int>> stack;  // full name, brace depth inside it
  int depth = 0;
  size_t pos = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), opener);
       it != std::sregex_iterator(); ++it) {
    for (; pos < static_cast<size_t>(it->position(0)); ++pos) {
      if (text[pos] == '{') {
        ++depth;
      } else if (text[pos] == '}') {
        --depth;
        while (!stack.empty() && stack.back().second > depth) stack.pop_back();
      }
    }
    std::string name = (*it)[1];
    std::string outer = stack.empty() ? "" : stack.back().first;
    std::string full = name.empty() ? outer : (outer.empty() ? name : outer + "::" + name);
    bool ok = name.empty() || full == want || full.rfind(want + "::", 0) == 0 ||
              full.rfind("std", 0) == 0 || full.rfind("nlohmann", 0) == 0 ||
              (public_api && full == "idemsaga");
    if (!ok) out.push_back(file + ": " + full + " (want " + want + ")");
    pos = it->position(0) + it->length(0);
    ++depth;
    stack.push_back({full, depth});
  }
  return out;
}

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Whether a file includes a public header, itself or through headers of its own folder (a
// .cpp, its header, the engine's alias header step.hpp): then it implements the public API.
bool IncludesPublicApi(const std::filesystem::path& root, const std::filesystem::path& path,
                       int levels = 3) {
  if (levels == 0 || !std::filesystem::exists(path)) return false;
  const std::string text = Read(path);
  if (text.find("#include \"idemsaga/") != std::string::npos) return true;
  const std::regex include(R"re(#include "([^"]+)")re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), include);
       it != std::sregex_iterator(); ++it) {
    auto header = root / (*it)[1].str();
    if (header.parent_path() == path.parent_path() && IncludesPublicApi(root, header, levels - 1)) {
      return true;
    }
  }
  return false;
}

// Every .cpp/.hpp under a top-level folder of the product (not the public headers, tests,
// benchmarks, examples or a build tree).
std::vector<std::filesystem::path> ProductSources(const std::filesystem::path& root) {
  const std::set<std::string> outside = {"include", "tests",   "bench",   "examples", "docs",
                                         "cmake",   "compose", "scripts", "sql"};
  std::vector<std::filesystem::path> out;
  for (const auto& top : std::filesystem::directory_iterator(root)) {
    auto name = top.path().filename().string();
    if (!top.is_directory() || outside.count(name) != 0 || name.rfind("build", 0) == 0 ||
        name[0] == '.')
      continue;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(top.path())) {
      auto ext = entry.path().extension();
      if (entry.is_regular_file() && (ext == ".cpp" || ext == ".hpp")) out.push_back(entry.path());
    }
  }
  return out;
}

}  // namespace namespaces

TEST(Architecture, EveryFileIsInItsFoldersNamespace) {
  const std::filesystem::path root = IDEMSAGA_SOURCE_DIR;
  auto files = namespaces::ProductSources(root);
  ASSERT_GT(files.size(), 100U) << "the sources were not found";
  for (const auto& path : files) {
    bool public_api = namespaces::IncludesPublicApi(root, path);
    auto rel = std::filesystem::relative(path, root).generic_string();
    for (const auto& wrong : namespaces::Misplaced(rel, namespaces::Read(path), public_api)) {
      ADD_FAILURE() << wrong << ": namespaces follow folders (docs/architecture.md)";
    }
  }
}

// The check itself: a file in another folder's namespace is caught; nesting, comments and
// strings are not.
TEST(Architecture, AFileInTheWrongNamespaceIsCaught) {
  using namespaces::Misplaced;
  EXPECT_EQ(namespaces::Expected("cmd/idemsaga/main.cpp"), "idemsaga::cmd");
  EXPECT_EQ(namespaces::Expected("orchestrator/store/x.cpp"), "idemsaga::orchestrator::store");
  EXPECT_TRUE(
      Misplaced("common/pg/a.cpp",
                "namespace idemsaga::common::pg {\nnamespace detail {\nnamespace {\n"
                "char c = '{';\n}\n}\n}\n// namespace saga {\nauto s = \"\\nnamespace saga {\";\n",
                false)
          .empty());
  EXPECT_EQ(Misplaced("orchestrator/store/a.cpp", "namespace idemsaga::orchestrator {\n}\n", false)
                .size(),
            1U);
  EXPECT_EQ(Misplaced("steps/saga/a.cpp", "namespace saga {\n}\n", false).size(), 1U);
  EXPECT_EQ(Misplaced("app/a.cpp", "namespace idemsaga {\n}\n", false).size(), 1U);
  EXPECT_TRUE(Misplaced("app/a.cpp", "namespace idemsaga {\n}\n", true).empty());
  EXPECT_EQ(Misplaced("common/a.cpp",
                      "namespace idemsaga::common {\nvoid F() { if (x) { } }\n}\nnamespace "
                      "idemsaga::steps {\n}\n",
                      false)
                .size(),
            1U);
}

}  // namespace
