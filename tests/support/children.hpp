// What a test that runs a launcher script (scripts/dev, scripts/ha) needs to prove that the
// script left nothing behind: with this process a child subreaper (PR_SET_CHILD_SUBREAPER),
// orphans among the script's descendants are re-parented here, so the live children listed
// once the script has exited are everything it started that still runs. Not thread-safe
// (it reaps any child that ended).
//   prctl(PR_SET_CHILD_SUBREAPER, 1); ... EXPECT_TRUE(test_support::LiveChildren().empty());
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace test_support {

// A whole file's text ("" when it cannot be read).
inline std::string SlurpFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Child {
  pid_t pid;
  std::string comm;
};

// Reaps the children that ended and lists those still alive.
inline std::vector<Child> LiveChildren() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  std::vector<Child> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string stat = SlurpFile(entry.path() / "stat");
    size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == getpid() && state != 'Z') {
      out.push_back({std::stoi(entry.path().filename()), stat.substr(open + 1, close - open - 1)});
    }
  }
  return out;
}

}  // namespace test_support
