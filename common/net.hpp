// Small network helpers every layer may use: a free loopback port, "host:port" values.
// Thread-safe.
#pragma once

#include <string>
#include <utility>

namespace idemsaga::common {

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
// Another process may take it before the caller binds: callers that can, retry. Throws
// std::runtime_error when no socket could be bound.
int FreeLoopbackPort();

// Splits "host:port" at its last colon; throws std::invalid_argument on a malformed value.
std::pair<std::string, int> SplitHostPort(const std::string& listen);

}  // namespace idemsaga::common
