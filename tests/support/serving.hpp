// Test helpers for services over real HTTP on loopback.
//
// Serving<T> constructs T (anything with Bind/Serve/Stop), binds it to 127.0.0.1:0 and serves
// on a thread until destroyed. The socket listens once Bind returns, so a client may connect
// at once (no sleeping). Call() sends one request the way callers of our services do.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

namespace test_support {

// Serving<T>(AtPort{p}, args...) binds a given port instead (one chosen with FreePort()).
struct AtPort {
  int port;
};

// A loopback port that was free a moment ago.
int FreePort();

template <typename T>
class Serving {
 public:
  template <typename... Args>
  explicit Serving(Args&&... args) : Serving(AtPort{0}, std::forward<Args>(args)...) {}
  template <typename... Args>
  explicit Serving(AtPort at, Args&&... args)
      : service(std::forward<Args>(args)...),
        port(service.Bind("127.0.0.1", at.port)),
        thread([this] { service.Serve(); }) {}
  ~Serving() {
    service.Stop();
    thread.join();
  }
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port); }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(20);
    return c;
  }

  T service;
  int port;
  std::thread thread;
};

struct Call {
  std::string key;
  std::string body;
  std::string tenant = "demo";              // X-Tenant-ID (participants); "" omits it
  std::string token = "dev-service-token";  // Bearer token; "" omits it
  std::string content_type = "application/json";
  httplib::Headers extra = {};
};

inline httplib::Result Post(httplib::Client& client, const std::string& path, const Call& call) {
  httplib::Headers headers = call.extra;
  if (!call.token.empty()) headers.emplace("Authorization", "Bearer " + call.token);
  if (!call.tenant.empty()) headers.emplace("X-Tenant-ID", call.tenant);
  if (!call.key.empty()) headers.emplace("Idempotency-Key", call.key);
  return client.Post(path.c_str(), headers, call.body, call.content_type.c_str());
}

// The `error.code` of a JSON error body, or a marker when the body is not one.
inline std::string ErrorCode(const httplib::Result& r) {
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("error")) return "<not an error body: " + r->body + ">";
  return j["error"]["code"].get<std::string>();
}

inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace test_support
