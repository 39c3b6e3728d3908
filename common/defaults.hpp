// Where a local orchestrator and its private PostgreSQL listen unless told: the CLI's default
// --url and `idemsaga dev`. The demo participants' ports and the dev service token are the
// demo's (demo/stack.hpp), not a default of any library.
#pragma once

#include <string>

namespace idemsaga::common::defaults {

inline constexpr int kPostgresPort = 54329;
inline constexpr int kOrchestratorPort = 8080;

// "http://127.0.0.1:PORT".
inline std::string LocalUrl(int port) { return "http://127.0.0.1:" + std::to_string(port); }
// "127.0.0.1:PORT": a --listen value.
inline std::string LocalListen(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace idemsaga::common::defaults
