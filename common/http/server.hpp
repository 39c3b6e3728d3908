// The one HTTP/1.1 server of every service, and the helpers every route uses.
//
// Contract. One event loop (Boost.Asio, `Limits::io_threads` threads) does all socket I/O and
// parses with Boost.Beast's parser under `Limits`: header bytes (request line included) and
// field count (431), request target (414), body per path (413, refused from Content-Length
// before a byte of the body is read), and a deadline per phase: the headers, the body, an idle
// keep-alive, a response write. A slow or idle client therefore costs a timer and a few hundred
// bytes, never a thread. Handlers block (PostgreSQL, participants), so a complete request runs
// on a pool of `Limits::threads` workers behind a queue of `Limits::queue`; when the queue is
// full the request is refused at once with 503 + Retry-After (admission control), as is one
// that waited `Limits::queue_timeout` there, and beyond `Limits::max_connections` a new
// connection gets a 503 and is closed.
//
// What a handler sees, as httplib::Request (a plain value here; cpp-httplib stays for clients):
//   - `headers`: every field line as sent, in order, duplicates kept. Values are byte for byte
//     what the client sent minus the optional whitespace around them (RFC 9110 §5.5): no
//     percent-decoding, no trimming inside. Field lines with control characters, obs-fold,
//     Content-Length with Transfer-Encoding, a Transfer-Encoding other than `chunked`, or a
//     bad Content-Length are refused with 400 before any handler runs.
//   - `target`: the request target as sent. `path`: its path, percent-decoded (`+` stays `+`).
//     Routes match (std::regex, whole path, first registered route wins) against the path
//     decoded but for `%2F` and `%25`, which stay encoded: a key in a path segment may hold a
//     `/`, and `/v1/orders/k%2Ftrace` is the order `k/trace`, never the trace of `k`.
//     `matches` holds the groups; DecodeCapture() turns one into the bytes sent. A target that is
//     not origin-form (`/...`), has raw non-ASCII bytes or a malformed `%` escape, or whose decoded
//     path or query holds a NUL or invalid UTF-8 is refused with 400: a route never sees a
//     truncated or altered key.
//   - `params`: the query, decoded (`+` is a space), as httplib does.
//   - `body`: the body, within the path's limit; `Content-Encoding` other than identity is 415.
// HEAD runs the GET route and sends no body; a path served under other methods only is 405
// (with Allow), an unknown path 404. Every 4xx/5xx without a body gets the JSON error body.
// A handler exception is answered by what the server's common::FailureClassifier says it means
// (common/failure.hpp; the server knows no store, its builder gives it the store's classifier,
// e.g. common::pg::Classify): 503 `unavailable` + Retry-After only for an outage a retry can
// cure, else 500. Responses carry Content-Length; keep-alive as the client asks, up to
// `keep_alive_max_count` requests.
//
// The pieces, internal to common/http: the connection state machine (connection.*: reads,
// deadlines, keep-alive, early and deferred answers), the workers (worker_pool.hpp), the routes
// (router.*), the wire format of answers (wire.*), the exception policy (exception_policy.*),
// and the loop, the acceptor and Stop() (server_core.hpp, server.cpp).
//
// Thread-safety: register routes before Serve() (adding one while serving is safe too); call
// Serve() once. Handlers run on the worker threads, concurrently. Stop() is safe from any
// thread at any time.
//   common::http::Server server({.threads = 32}, common::pg::Classify);
//   server.Get("/healthz", handler); int port = server.Bind("127.0.0.1", 0); server.Serve();
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/failure.hpp"
#include "common/http/problem.hpp"
#include "common/request_input.hpp"

namespace idemsaga::common::http {

namespace detail {
class ServerCore;
}

// A route's captured group as the client meant it: `%2F` and `%25` decoded (see above).
std::string DecodeCapture(std::string_view capture);

struct Limits {
  size_t max_body_bytes = 64 * 1024;  // orders and step calls are < 2 KiB; 64 KiB is generous
  // Routes that take larger bodies (the OTLP trace intake): path -> bytes.
  std::map<std::string, size_t> large_bodies = {};
  int max_json_depth = 16;  // our payloads nest 3 deep
  // Header bytes, request line included (431; 414 if the request line alone is longer). Our
  // callers send < 1 KiB; 16 KiB is what common proxies allow.
  size_t max_header_bytes = 16 * 1024;
  size_t max_header_fields = 100;      // 431 beyond; we use about 10
  size_t max_target_bytes = 8 * 1024;  // 414 beyond; keys are at most a few hundred bytes
  size_t threads = 32;                 // workers: handlers block on PostgreSQL and participants
  size_t queue = 256;  // complete requests waiting for a worker; beyond it, 503 at once
  // A request that waited this long for a worker is answered 503 + Retry-After instead of
  // run: under overload the queue stays full, and a deep queue would otherwise turn into
  // seconds of waiting (then a timeout) rather than a quick, retryable refusal.
  std::chrono::milliseconds queue_timeout{1000};
  size_t io_threads = 1;  // parsing is cheap: one core parses far more than 32 workers serve
  // Open connections; the next one gets a 503 and is closed. Keep it under RLIMIT_NOFILE.
  size_t max_connections = 4096;
  int backlog = 1024;  // kernel queue for bursts (duplicate storms)
  // Deadlines per phase: the first byte of a request to the end of its headers (a slowloris
  // gets 408 and is closed), the end of the headers to the end of the body, writing one
  // response, and waiting idle for the next request on a kept-alive connection.
  time_t header_timeout_s = 10;
  time_t body_timeout_s = 30;  // a 4 MiB OTLP batch over a slow link
  time_t write_timeout_s = 5;
  size_t keep_alive_max_count = 1000;
  // An idle connection costs no worker; short all the same, because a client that reuses a
  // connection the server is closing at that instant sees an error it must retry.
  time_t keep_alive_timeout_s = 2;
};

// The body limit of `path` under `limits`.
size_t BodyLimitFor(const Limits& limits, std::string_view path);

// Answers a request from any thread before its handler returns: for a handler that owes its
// client an answer within a time budget (a 202 and where to look) while it works on. Whatever
// the handler leaves in its response afterwards is dropped. A route gets its request's handle
// as an argument of its handler (Server::EarlyHandler); it is passed, never looked up.
//   server.Post("/v1/things", [](const auto& req, auto& res, const EarlyAnswer& early) {
//     // later, from any thread: false when the handler returned first
//     early.Send(accepted_response);
//   });
class EarlyAnswer {
 public:
  using SendFn = std::function<bool(httplib::Response)>;
  EarlyAnswer() = default;
  explicit EarlyAnswer(SendFn send) : send_(std::move(send)) {}
  explicit operator bool() const { return static_cast<bool>(send_); }
  // True when `res` is the request's answer: its handler had not returned, and no other early
  // answer had gone.
  bool Send(httplib::Response res) const { return send_ && send_(std::move(res)); }

 private:
  SendFn send_;
};

class Server {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // A handler that may answer its request from another thread (EarlyAnswer, DeferAnswer).
  using EarlyHandler =
      std::function<void(const httplib::Request&, httplib::Response&, const EarlyAnswer&)>;

  // `classify` says what a handler's exception means; empty: common::ClassifyPlain (only
  // common::Unavailable is an outage).
  explicit Server(Limits limits = {}, FailureClassifier classify = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // `pattern` is a std::regex matched against the whole decoded path.
  Server& Get(const std::string& pattern, Handler handler);
  Server& Post(const std::string& pattern, Handler handler);
  Server& Put(const std::string& pattern, Handler handler);
  Server& Get(const std::string& pattern, EarlyHandler handler);
  Server& Post(const std::string& pattern, EarlyHandler handler);
  // A handler tried first on the event loop, before the request is handed to a worker: it
  // answers `res` and returns true only when it can without blocking (from memory: a replay
  // of a cached answer, say), which saves the two hand-offs between threads. False, or an
  // exception, hands the request to `handler` on a worker as usual, and whatever it wrote to
  // `res` is dropped.
  using FastHandler = std::function<bool(const httplib::Request&, httplib::Response&)>;
  Server& Post(const std::string& pattern, EarlyHandler handler, FastHandler fast);

  // The routes registered, in matching order (for a contract test: every route documented).
  struct RouteInfo {
    std::string method;
    std::string pattern;
  };
  std::vector<RouteInfo> Routes() const;

  const Limits& limits() const;
  // Binds and listens (clients may connect at once) and returns the port (0 picks a free
  // one); -1 on failure.
  int Bind(const std::string& host, int port);
  // Serves on the calling thread until Stop(); false if it was never bound.
  bool Serve();
  // Safe from any thread at any time, even before Serve() runs. Stops accepting, closes idle
  // and half-received connections at once, lets admitted requests finish and answers them
  // with `Connection: close`, then returns once Serve() has returned (or will return at once).
  // From a handler it only starts the stop (waiting there would wait for itself).
  void Stop();

 private:
  std::unique_ptr<detail::ServerCore> impl_;
};

// Leaves the request unanswered when its handler returns: the answer comes later, from any
// thread, through the request's EarlyAnswer, and the connection waits for it holding no
// worker. The handler must have handed that EarlyAnswer to something that sends it in every
// case (a job and a timer), or the client waits until it gives up. `res` itself is dropped.
void DeferAnswer(httplib::Response& res);

// Answers the one error body, a problem (common/http/problem.hpp).
void SetError(httplib::Response& res, int status, std::string_view code, std::string_view message);
// Answers `answer` as it is: its status, body, Content-Type and headers.
void SetAnswer(httplib::Response& res, const Answer& answer);

// Asks the server to close the connection without sending any response, as if the process
// had died after doing the work (fault injection: "commit, then drop"). The client sees the
// connection closed with no status line. `res.status` becomes 500 for logs and spans only.
void CloseWithoutResponse(httplib::Response& res);

// Parses the body as JSON once, within the server's limits (common::ReadJsonBody). On failure
// sets a 400, 413 or 415 on `res` and returns nullopt.
using NulInJson = common::NulInJson;
std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits,
                                            NulInJson nul = NulInJson::kRefuse);

// Answers a failure by what `classify` says it means (common::pg::Classify for PostgreSQL,
// given by whoever built the edge): an outage (the database down,
// restarting, failing over, unsure of a commit) is 503 `unavailable` + Retry-After; a value
// the database refused is a 500 that says a retry fails the same way; anything else a 500.
ClassifiedFailure SetFailure(httplib::Response& res, const std::exception_ptr& ep,
                             const FailureClassifier& classify);

// 503 `unavailable` with Retry-After: an outage, after which a retry with the same key is safe.
void SetUnavailable(httplib::Response& res, const std::string& what);

// GET /healthz (the process answers) and GET /readyz (its database answers too:
// `database_ready`, e.g. common::pg::Reachable).
void AddHealthRoutes(Server& server, std::function<bool()> database_ready);

// The token of the request's `Authorization: Bearer <token>` (common::BearerTokenOf).
std::string BearerToken(const httplib::Request& req);

}  // namespace idemsaga::common::http
