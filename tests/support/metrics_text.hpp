// Reading a /metrics page in tests: one sample's value, and Prometheus' own linter over the
// whole page (promtool check metrics; scripts/promtool.sh finds or unpacks it).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace test_support {

// The value of the sample written exactly `series` (name and labels, as rendered); -1 when
// the page has no such line.
inline double Sample(const std::string& page, const std::string& series) {
  std::string needle = "\n" + series + " ";
  auto at = ("\n" + page).find(needle);
  if (at == std::string::npos) return -1;
  return std::strtod(page.c_str() + at + needle.size() - 1, nullptr);
}

// "" when promtool accepts `page`; otherwise what it said (or why it could not run).
inline std::string PromtoolProblems(const std::string& page) {
  char path[] = "/tmp/idemsaga-metrics-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return "cannot write a temporary file";
  {
    std::ofstream out(path);
    out << page;
  }
  close(fd);
  std::string command = std::string("tool=$(bash '") + IDEMSAGA_SOURCE_DIR +
                        "/scripts/promtool.sh') && \"$tool\" check metrics < '" + path + "' 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "cannot run promtool";
  char buf[512];
  while (fgets(buf, sizeof buf, pipe) != nullptr) output += buf;
  int status = pclose(pipe);
  std::remove(path);
  return status == 0 ? "" : "promtool: " + (output.empty() ? "failed" : output);
}

}  // namespace test_support
