// One log line per event, as `ts=... event=... key=value ...` on stderr.
//
// Thread-safe: lines from different threads never interleave.
//   common::Log("step_call", {{"tenant", t}, {"key", k}, {"step", "inventory"}});
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace common {

using LogField = std::pair<std::string_view, std::string_view>;

void Log(std::string_view event, std::initializer_list<LogField> fields = {});

// Silences Log (tests that expect noisy failures).
void SetLogEnabled(bool enabled);

}  // namespace common
