// One log line per event on stderr: `ts=... event=... key=value ...`, or with LogFormat::kJson
// one JSON object per line ({"ts":...,"event":...,"key":"value",...}; invalid UTF-8 becomes
// U+FFFD) for a log pipeline.
//
// Thread-safe: lines from different threads never interleave.
//   common::Log("step_call", {{"tenant", t}, {"key", k}, {"step", "inventory"}});
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace idemsaga::common {

using LogField = std::pair<std::string_view, std::string_view>;

void Log(std::string_view event, std::initializer_list<LogField> fields = {});

enum class LogFormat { kText, kJson };
void SetLogFormat(LogFormat format);

// Silences Log (tests that expect noisy failures).
void SetLogEnabled(bool enabled);

}  // namespace idemsaga::common
