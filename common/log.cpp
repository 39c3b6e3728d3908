#include "common/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>

namespace idemsaga::common {
namespace {

std::atomic<bool> log_enabled{true};
std::atomic<LogFormat> log_format{LogFormat::kText};
std::mutex log_mutex;

bool NeedsQuotes(std::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20) return true;
  }
  return false;
}

void AppendValue(std::string& line, std::string_view v) {
  if (!NeedsQuotes(v)) {
    line.append(v);
    return;
  }
  line.push_back('"');
  for (char c : v) {
    if (c == '"' || c == '\\') line.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) {
      line.push_back(' ');
      continue;
    }
    line.push_back(c);
  }
  line.push_back('"');
}

}  // namespace

void SetLogEnabled(bool enabled) { log_enabled = enabled; }

void SetLogFormat(LogFormat format) { log_format = format; }

namespace {

std::string JsonLine(const char* ts, std::string_view event,
                     std::initializer_list<LogField> fields) {
  nlohmann::json line = {{"ts", ts}, {"event", event}};
  for (const auto& [k, v] : fields) line[std::string(k)] = v;
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace

void Log(std::string_view event, std::initializer_list<LogField> fields) {
  if (!log_enabled) return;
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[64];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(millis));
  if (log_format == LogFormat::kJson) {
    auto line = JsonLine(ts, event, fields);
    std::lock_guard lock(log_mutex);
    std::fwrite(line.data(), 1, line.size(), stderr);
    return;
  }
  std::string line = "ts=";
  line.append(ts).append(" event=");
  AppendValue(line, event);
  for (const auto& [k, v] : fields) {
    line.push_back(' ');
    line.append(k).push_back('=');
    AppendValue(line, v);
  }
  line.push_back('\n');
  std::lock_guard lock(log_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace idemsaga::common
