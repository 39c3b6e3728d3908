#include "common/crash_point.hpp"

#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "common/log.hpp"

namespace common {
namespace {

struct Armed {
  std::mutex mutex;
  std::map<std::string, int, std::less<>> remaining;  // name -> hits left before the crash
};

Armed* Load() {
  const char* spec = std::getenv("IDEMSAGA_CRASH_POINTS");
  if (spec == nullptr || *spec == '\0') return nullptr;
  auto* armed = new Armed;  // lives until the process dies, by design
  std::string s = spec;
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
  return armed;
}

}  // namespace

void CrashPoint(std::string_view name) {
  static Armed* const armed = Load();
  if (armed == nullptr) return;
  std::lock_guard lock(armed->mutex);
  auto it = armed->remaining.find(name);
  if (it == armed->remaining.end() || --it->second > 0) return;
  Log("crash_point", {{"point", name}});
  std::raise(SIGKILL);
}

}  // namespace common
