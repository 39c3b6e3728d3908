// The README's code is the real code, word for word, so the build keeps it compiling: its
// "Define your own saga" example is the shipped ship_order saga, and its "Use idemsaga in your
// own project" blocks are examples/trip_booking's (built by install_example_test).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string Read(const std::string& path) {
  std::ifstream in(std::string(IDEMSAGA_SOURCE_DIR) + "/" + path);
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

TEST(Readme, TheDefineYourOwnSagaExampleIsTheShippedSagasCode) {
  auto readme = Between(Read("README.md"), "## Define your own saga", "```cpp\n", "```\n");
  auto code = Between(Read("steps/ship_order.cpp"), "// [define-your-own-saga]\n",
                      "// [define-your-own-saga]\n", "// [define-your-own-saga]\n");
  EXPECT_FALSE(code.empty());
  EXPECT_EQ(readme, code);
}

// The n-th ```lang block after the README's heading `heading`.
std::string ReadmeBlock(const std::string& heading, const std::string& lang, int n) {
  auto readme = Read("README.md");
  auto at = readme.find(heading);
  if (at == std::string::npos) return "<no " + heading + ">";
  const std::string open = "```" + lang + "\n";
  for (int i = 0; i < n; ++i) {
    at = readme.find(open, at);
    if (at == std::string::npos) return "<no block>";
    at += open.size();
  }
  auto end = readme.find("```\n", at);
  return end == std::string::npos ? "<unclosed>" : readme.substr(at, end - at);
}

// The text between the two lines `marker` in `path`.
std::string Marked(const std::string& path, const std::string& marker) {
  return Between(Read(path), marker + "\n", marker + "\n", marker + "\n");
}

TEST(Readme, TheParallelStepsExampleIsTheShippedSagasCode) {
  auto code = Marked("steps/place_order.cpp", "  // [parallel-steps]");
  EXPECT_NE(code.find("d.Parallel("), std::string::npos);
  EXPECT_EQ(ReadmeBlock("- **Parallel steps.**", "cpp", 1), code);
}

TEST(Readme, TheChildSagaExampleIsTheShippedSagasCode) {
  auto code = Marked("steps/deliver_order.cpp", "// [child-saga]");
  EXPECT_NE(code.find(".Child("), std::string::npos);
  EXPECT_EQ(ReadmeBlock("- **Child sagas.**", "cpp", 1), code);
}

TEST(Readme, TheTestYourSagasExampleIsTheKitTestsCode) {
  auto code = Marked("tests/unit/testing_kit_test.cpp", "// [test-your-sagas]");
  EXPECT_NE(code.find("kit::CheckCrashes("), std::string::npos);
  EXPECT_EQ(ReadmeBlock("### Test your sagas", "cpp", 1), code);
}

TEST(Readme, TheUseInYourOwnProjectBlocksAreTheExamplesCode) {
  const std::string section = "## Use idemsaga in your own project";
  auto cmake = Marked("examples/trip_booking/CMakeLists.txt", "# [cmake]");
  auto route = Marked("examples/trip_booking/participants.cpp", "// [guard-on-a-route]");
  auto saga = Marked("examples/trip_booking/trip_saga.cpp", "// [trip-saga]");
  EXPECT_NE(cmake.find("find_package(idemsaga"), std::string::npos);
  EXPECT_NE(route.find("http.ExternalAction"), std::string::npos);
  EXPECT_NE(saga.find("saga::Definition(\"trip\""), std::string::npos);
  EXPECT_EQ(ReadmeBlock(section, "cmake", 1), cmake);
  EXPECT_EQ(ReadmeBlock(section, "cpp", 1), route);
  EXPECT_EQ(ReadmeBlock(section, "cpp", 2), saga);
}

}  // namespace
