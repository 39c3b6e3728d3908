// An httplib::Server with the limits a public service needs, and the helpers every route uses.
//
// Debian's cpp-httplib is a compiled library, so its limits are runtime settings; this sets
// them all in one place: body size, read/write timeouts, keep-alive, a fixed thread pool whose
// queue blocks the accept loop when full (back-pressure into the kernel backlog instead of an
// unbounded queue), and a listen backlog larger than the .so's fixed 5.
// Thread-safety: configure before Serve(); handlers run on the pool's threads.
//   common::http::Server server({.threads = 32});
//   int port = server.Bind("127.0.0.1", 0); server.Serve();
#pragma once

#include <httplib.h>

#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace common::pg {
class Pool;
}

namespace common::http {

struct Limits {
  size_t max_body_bytes = 64 * 1024;  // orders and step calls are < 2 KiB; 64 KiB is generous
  // Routes that take larger bodies (the OTLP trace intake): path -> bytes.
  std::map<std::string, size_t> large_bodies = {};
  int max_json_depth = 16;  // our payloads nest 3 deep
  size_t threads = 32;      // handlers block on PostgreSQL and participants
  size_t queue = 256;       // accepted connections waiting for a thread
  int backlog = 1024;       // kernel queue for bursts (duplicate storms)
  time_t read_timeout_s = 5;
  time_t write_timeout_s = 5;
  size_t keep_alive_max_count = 1000;
  // Idle keep-alive connections hold a worker until this passes, and a shutdown waits for
  // them (httplib offers no way to close them sooner): short, yet enough for back-to-back
  // step calls to reuse a connection.
  time_t keep_alive_timeout_s = 2;
};

class Server : public httplib::Server {
 public:
  explicit Server(Limits limits = {});
  const Limits& limits() const { return limits_; }
  // The body limit of `path`.
  size_t BodyLimit(const std::string& path) const;
  // Binds and returns the port (0 picks a free one); -1 on failure.
  int Bind(const std::string& host, int port);
  // Serves until Stop(); returns false if the listen loop failed.
  bool Serve();
  // Safe from any thread at any time, even before Serve() has started its loop (httplib's
  // stop() is lost then): returns once Serve() has returned or will return at once.
  void Stop();

 private:
  Limits limits_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> serving_{false};
};

// The one error body: {"error":{"code":...,"message":...}}.
std::string ErrorBody(std::string_view code, std::string_view message);
void SetError(httplib::Response& res, int status, std::string_view code, std::string_view message);

// Parses the body as JSON once, within the server's depth limit. On failure sets a 400 or 415
// on `res` and returns nullopt.
std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits);

// 503 `unavailable` with Retry-After: an outage, after which a retry with the same key is safe.
void SetUnavailable(httplib::Response& res, const std::string& what);

// GET /healthz (the process answers) and GET /readyz (its database answers too).
void AddHealthRoutes(Server& server, pg::Pool& pool);

// The token of an `Authorization: Bearer <token>` header, or "" when absent or malformed.
std::string BearerToken(const httplib::Request& req);

// Splits "host:port"; throws std::invalid_argument on a malformed value.
std::pair<std::string, int> SplitHostPort(const std::string& listen);

}  // namespace common::http
