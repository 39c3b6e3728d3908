// The README and docs/ show the real code, word for word, so the build keeps it compiling:
// the README's saga is examples/trip_booking's, docs/sagas.md's "Define your own saga" example
// is the shipped ship_order saga, and docs/library.md's "Use idemsaga in your own project"
// blocks are examples/trip_booking's (built by install_example_test). The README stays a short
// front page whose links reach every docs/ page, and no relative link in them is broken.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = IDEMSAGA_SOURCE_DIR;

std::string Read(const std::string& path) {
  std::ifstream in(kRoot / path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The text between `open` and the next `close` after the first `from`.
std::string Between(const std::string& text, const std::string& from, const std::string& open,
                    const std::string& close) {
  auto at = text.find(from);
  if (at == std::string::npos) return "<no " + from + ">";
  auto begin = text.find(open, at);
  if (begin == std::string::npos) return "<no " + open + ">";
  begin += open.size();
  auto end = text.find(close, begin);
  return end == std::string::npos ? "<no " + close + ">" : text.substr(begin, end - begin);
}

// The n-th ```lang block after the text `heading` in the Markdown file `path`.
std::string Block(const std::string& path, const std::string& heading, const std::string& lang,
                  int n) {
  auto doc = Read(path);
  auto at = doc.find(heading);
  if (at == std::string::npos) return "<no " + heading + " in " + path + ">";
  const std::string open = "```" + lang + "\n";
  for (int i = 0; i < n; ++i) {
    at = doc.find(open, at);
    if (at == std::string::npos) return "<no block>";
    at += open.size();
  }
  auto end = doc.find("```\n", at);
  return end == std::string::npos ? "<unclosed>" : doc.substr(at, end - at);
}

// The text between the two lines `marker` in `path`.
std::string Marked(const std::string& path, const std::string& marker) {
  return Between(Read(path), marker + "\n", marker + "\n", marker + "\n");
}

TEST(Readme, TheDefineYourOwnSagaExampleIsTheShippedSagasCode) {
  auto code = Marked("steps/ship_order.cpp", "// [define-your-own-saga]");
  EXPECT_NE(code.find("saga::Definition(\"ship_order\""), std::string::npos);
  EXPECT_EQ(Block("docs/sagas.md", "## Define your own saga", "cpp", 1), code);
}

TEST(Readme, TheParallelStepsExampleIsTheShippedSagasCode) {
  auto code = Marked("steps/place_order.cpp", "  // [parallel-steps]");
  EXPECT_NE(code.find("d.Parallel("), std::string::npos);
  EXPECT_EQ(Block("docs/sagas.md", "- **Parallel steps.**", "cpp", 1), code);
}

TEST(Readme, TheChildSagaExampleIsTheShippedSagasCode) {
  auto code = Marked("steps/deliver_order.cpp", "// [child-saga]");
  EXPECT_NE(code.find(".Child("), std::string::npos);
  EXPECT_EQ(Block("docs/sagas.md", "- **Child sagas.**", "cpp", 1), code);
}

TEST(Readme, TheTestYourSagasExampleIsTheExamplesOwnTest) {
  auto code = Marked("examples/trip_booking/trip_saga_test.cpp", "// [test-your-sagas]");
  EXPECT_NE(code.find("kit::CheckCrashes("), std::string::npos);
  EXPECT_EQ(Block("docs/library.md", "## Test the saga", "cpp", 1), code);
}

TEST(Readme, TheUseInYourOwnProjectBlocksAreTheExamplesCode) {
  const std::string page = "docs/library.md";
  auto cmake = Marked("examples/trip_booking/CMakeLists.txt", "# [cmake]");
  auto saga = Marked("examples/trip_booking/trip_saga.cpp", "// [trip-saga]");
  auto main = Marked("examples/trip_booking/orchestrator.cpp", "// [trip-orchestrator]");
  auto hotel = Marked("examples/trip_booking/hotel.cpp", "// [hotel]");
  EXPECT_NE(cmake.find("find_package(idemsaga"), std::string::npos);
  EXPECT_NE(saga.find("idemsaga::Definition(\"trip\""), std::string::npos);
  EXPECT_NE(main.find("idemsaga::App app"), std::string::npos);
  EXPECT_NE(hotel.find("idemsaga::Participant hotel"), std::string::npos);
  EXPECT_EQ(Block(page, "## Install", "cmake", 1), cmake);
  EXPECT_EQ(Block(page, "## The saga", "cpp", 1), saga);
  EXPECT_EQ(Block(page, "## The orchestrator", "cpp", 1), main);
  EXPECT_EQ(Block(page, "## A participant", "cpp", 1), hotel);
}

// The page's FetchContent block makes idemsaga available as tests/install/subproject does.
TEST(Readme, TheBuildFromSourceBlockIsWhatTheSubprojectTestBuilds) {
  auto block = Block("docs/library.md", "## Install", "cmake", 2);
  auto project = Read("tests/install/subproject/CMakeLists.txt");
  for (const char* line : {"include(FetchContent)", "FetchContent_MakeAvailable(idemsaga)"}) {
    EXPECT_NE(block.find(line), std::string::npos) << block;
    EXPECT_NE(project.find(line), std::string::npos) << line;
  }
}

TEST(Readme, TheInProcessClientExampleIsTheTestsCode) {
  auto code = Marked("tests/integration/app_client_itest.cpp", "  // [in-process-client]");
  EXPECT_NE(code.find("app_.Start("), std::string::npos);
  EXPECT_EQ(Block("docs/library.md", "## Start runs from your own code", "cpp", 1), code);
}

TEST(Readme, TheRedisParticipantExampleIsTestedCode) {
  auto code = Marked("tests/integration/participant_stores_itest.cpp", "// [redis-participant]");
  EXPECT_NE(code.find(".redis_url = redis_url"), std::string::npos);
  EXPECT_EQ(Block("docs/participants.md", "## Keys in Redis", "cpp", 1), code);
}

// The README's short saga is the trip saga's definition, as examples/trip_booking has it.
TEST(Readme, TheReadmesSagaIsTheExamplesCode) {
  auto block = Block("README.md", "## A saga", "cpp", 1);
  auto saga = Marked("examples/trip_booking/trip_saga.cpp", "// [trip-saga]");
  EXPECT_NE(block.find("idemsaga::Definition MakeTripSaga("), std::string::npos) << block;
  EXPECT_NE(saga.find(block), std::string::npos)
      << "the README's saga is not examples/trip_booking/trip_saga.cpp's code:\n"
      << block;
}

// The lines of a Markdown file outside its fenced code blocks.
std::vector<std::string> UnfencedLines(const std::string& doc) {
  std::vector<std::string> out;
  std::istringstream in(doc);
  bool fenced = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0 || line.rfind("  ```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (!fenced) out.push_back(line);
  }
  return out;
}

// Those lines without their code spans either: where links are.
std::vector<std::string> ProseLines(const std::string& doc) {
  // Code spans may run over a line's end: drop them from the text as a whole.
  std::string text;
  for (const auto& line : UnfencedLines(doc)) text += line + "\n";
  std::string prose;
  bool span = false;
  for (char c : text) {
    if (c == '`') {
      span = !span;
    } else if (!span || c == '\n') {
      prose += c;
    }
  }
  std::vector<std::string> lines;
  std::istringstream again(prose);
  for (std::string line; std::getline(again, line);) lines.push_back(line);
  return lines;
}

// The targets of the links and images in a Markdown file: `[text](target)`.
std::vector<std::string> LinkTargets(const std::string& doc) {
  static const std::regex link(R"re(\]\(([^)\s]+)(?:\s+"[^"]*")?\))re");
  std::vector<std::string> out;
  for (const auto& line : ProseLines(doc)) {
    for (std::sregex_iterator it(line.begin(), line.end(), link), e; it != e; ++it) {
      out.push_back((*it)[1].str());
    }
  }
  return out;
}

// The anchors GitHub makes of a Markdown file's headings: lower case, punctuation dropped,
// spaces as dashes, a repeated one numbered.
std::set<std::string> Anchors(const std::string& doc) {
  std::set<std::string> out;
  for (const auto& line : UnfencedLines(doc)) {
    auto hashes = line.find_first_not_of('#');
    if (hashes == 0 || hashes == std::string::npos || line[hashes] != ' ') continue;
    std::string slug;
    for (unsigned char c : line.substr(hashes + 1)) {
      if (std::isalnum(c) || c >= 0x80 || c == '-' || c == '_') {
        slug += static_cast<char>(std::tolower(c));
      } else if (c == ' ') {
        slug += '-';
      }
    }
    while (!slug.empty() && slug.front() == '-') slug.erase(0, 1);
    std::string unique = slug;
    for (int n = 1; out.count(unique); ++n) unique = slug + "-" + std::to_string(n);
    out.insert(unique);
  }
  return out;
}

std::vector<std::string> DocsPages() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kRoot / "docs")) {
    if (e.path().extension() == ".md") out.push_back("docs/" + e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Readme, IsAFrontPageOfAtMost250Lines) {
  auto readme = Read("README.md");
  EXPECT_LE(std::count(readme.begin(), readme.end(), '\n'), 250);
}

// The README's link list reaches every page under docs/, and every docs/ page it names exists.
TEST(Readme, LinksEveryDocsPageAndEveryPageItLinksExists) {
  std::set<std::string> linked;
  for (const auto& target : LinkTargets(Read("README.md"))) {
    auto path = target.substr(0, target.find('#'));
    if (path.rfind("docs/", 0) != 0) continue;
    linked.insert(path);
    EXPECT_TRUE(fs::exists(kRoot / path)) << "README.md links " << target << ": no such file";
  }
  auto pages = DocsPages();
  EXPECT_GE(pages.size(), 13u);
  for (const auto& page : pages) {
    EXPECT_TRUE(linked.count(page)) << page << " is not linked from the README";
  }
}

// Every relative link of README.md and docs/*.md names a file that exists, and an anchor in a
// Markdown file names one of its headings.
TEST(Readme, EveryRelativeLinkInTheReadmeAndDocsPointsToAFileThatExists) {
  std::vector<std::string> files = DocsPages();
  files.insert(files.begin(), "README.md");
  int checked = 0;
  for (const auto& file : files) {
    for (const auto& target : LinkTargets(Read(file))) {
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
          target.rfind("mailto:", 0) == 0) {
        continue;
      }
      ++checked;
      auto hash = target.find('#');
      auto path = target.substr(0, hash);
      auto resolved =
          path.empty() ? fs::path(file) : (fs::path(file).parent_path() / path).lexically_normal();
      ASSERT_FALSE(resolved.empty()) << file << ": " << target;
      EXPECT_NE(resolved.begin()->string(), "..") << file << ": " << target << " leaves the tree";
      if (!fs::exists(kRoot / resolved)) {
        ADD_FAILURE() << file << " links " << target << ": " << resolved << " does not exist";
        continue;
      }
      if (hash != std::string::npos && resolved.extension() == ".md") {
        auto anchor = target.substr(hash + 1);
        EXPECT_TRUE(Anchors(Read(resolved.string())).count(anchor))
            << file << " links " << target << ": " << resolved << " has no heading #" << anchor;
      }
    }
  }
  EXPECT_GE(checked, 30);
}

}  // namespace
