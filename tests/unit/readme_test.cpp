// The README and docs/ show the real code, word for word, so the build keeps it compiling:
// the README's saga is examples/trip_booking's, docs/sagas.md's "Define your own saga" example
// is the shipped ship_order saga, and docs/library.md's "Use idemsaga in your own project"
// blocks are examples/trip_booking's (built by install_example_test). The README stays a short
// front page whose links reach every docs/ page, and no relative link in them is broken.
#include <gtest/gtest.h>

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

TEST(Readme, TheUseInYourOwnProjectBlocksAreTheExamplesCode) {
  const std::string page = "docs/library.md";
  const std::string section = "# Use idemsaga in your own project";
  auto cmake = Marked("examples/trip_booking/CMakeLists.txt", "# [cmake]");
  auto route = Marked("examples/trip_booking/participants.cpp", "// [guard-on-a-route]");
  auto saga = Marked("examples/trip_booking/trip_saga.cpp", "// [trip-saga]");
  EXPECT_NE(cmake.find("find_package(idemsaga"), std::string::npos);
  EXPECT_NE(route.find("http.ExternalAction"), std::string::npos);
  EXPECT_NE(saga.find("saga::Definition(\"trip\""), std::string::npos);
  EXPECT_EQ(Block(page, section, "cmake", 1), cmake);
  EXPECT_EQ(Block(page, section, "cpp", 1), route);
  EXPECT_EQ(Block(page, section, "cpp", 2), saga);
}

// The README's short saga is the trip saga's definition, as examples/trip_booking has it.
TEST(Readme, TheReadmesSagaIsTheExamplesCode) {
  auto block = Block("README.md", "## A saga", "cpp", 1);
  auto saga = Marked("examples/trip_booking/trip_saga.cpp", "// [trip-saga]");
  EXPECT_NE(block.find("saga::Definition MakeTripSaga("), std::string::npos) << block;
  EXPECT_NE(saga.find(block), std::string::npos)
      << "the README's saga is not examples/trip_booking/trip_saga.cpp's code:\n" << block;
}

}  // namespace
