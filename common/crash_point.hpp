// Named crash points for fault tests: off unless IDEMSAGA_CRASH_POINTS names them, e.g.
//   IDEMSAGA_CRASH_POINTS=after_claim            (the first time the point is reached)
//   IDEMSAGA_CRASH_POINTS=between_compensations@3,after_finish@2   (the Nth time)
// At an enabled point the process SIGKILLs itself: no destructor, flush or commit runs, as
// in a real crash. Thread-safe; a disabled point costs one relaxed atomic load.
#pragma once

#include <string_view>

namespace common {

void CrashPoint(std::string_view name);

}  // namespace common
