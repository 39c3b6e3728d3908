// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
// Another process may take it before the caller binds: callers that can, retry. Thread-safe.
#pragma once

namespace common {

// Throws std::runtime_error when no socket could be bound.
int FreeLoopbackPort();

}  // namespace common
