// The local stack's defaults in one place: every service, the CLI and `idemsaga dev` take
// their default ports and the dev service token from here. The token is for a local stack
// only; a deployment sets its own (--service-token, IDEMSAGA_SERVICE_TOKEN).
#pragma once

#include <string>

namespace idemsaga::common::defaults {

inline constexpr const char* kServiceToken = "dev-service-token";
inline constexpr int kPostgresPort = 54329;
inline constexpr int kOrchestratorPort = 8080;
inline constexpr int kInventoryPort = 8081;
inline constexpr int kPaymentPort = 8082;
inline constexpr int kShippingPort = 8083;

// "http://127.0.0.1:PORT".
inline std::string LocalUrl(int port) { return "http://127.0.0.1:" + std::to_string(port); }
// "127.0.0.1:PORT": a --listen value.
inline std::string LocalListen(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace idemsaga::common::defaults
