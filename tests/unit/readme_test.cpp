// The README's code is the real code: its "Define your own saga" example is the shipped
// ship_order saga, word for word, so the build keeps it compiling.
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

}  // namespace
