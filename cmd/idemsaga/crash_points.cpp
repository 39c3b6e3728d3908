#include "cmd/idemsaga/crash_points.hpp"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/log.hpp"

namespace idemsaga::cmd {
namespace {

struct Armed {
  std::mutex mutex;
  std::map<std::string, int, std::less<>> remaining;  // name -> hits left before the crash
};

}  // namespace

steps::saga::Runner::AtBoundary CrashPoints(std::string_view spec) {
  auto armed = std::make_shared<Armed>();
  std::string s(spec);
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      auto at = item.find('@');
      int nth = at == std::string::npos ? 1 : std::max(1, std::atoi(item.c_str() + at + 1));
      armed->remaining[item.substr(0, at)] = nth;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (armed->remaining.empty()) return {};
  return [armed](std::string_view point) {
    std::lock_guard lock(armed->mutex);
    auto it = armed->remaining.find(point);
    if (it == armed->remaining.end() || --it->second > 0) return;
    common::Log("crash_point", {{"point", point}});
    std::raise(SIGKILL);
  };
}

steps::saga::Runner::AtBoundary CrashPointsFromEnvironment() {
  const char* spec = std::getenv("IDEMSAGA_CRASH_POINTS");
  return CrashPoints(spec == nullptr ? "" : spec);
}

}  // namespace idemsaga::cmd
