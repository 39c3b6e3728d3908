#include "common/http/server.hpp"

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/status.hpp>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <regex>
#include <shared_mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/http/request_parser.hpp"
#include "common/log.hpp"
#include "common/pg/errors.hpp"
#include "common/pg/pool.hpp"

namespace common::http {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using detail::IEquals;

namespace {

// Set by CloseWithoutResponse; never sent (the connection closes instead).
constexpr const char* kCloseMarker = "X-Idemsaga-Close-Without-Response";
constexpr const char* kDeferMarker = "X-Idemsaga-Answer-Deferred";
constexpr size_t kReadChunk = 4096;
// After an answer with `Connection: close`, read and drop what the client still sends for a
// while before closing: closing a socket with unread input sends a reset, which can destroy
// the answer (a 413 or 431) before the client reads it.
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kLingerBytes = size_t{4} << 20;

struct StatusText {
  std::string_view code;
  std::string_view message;
};

// What a bare status means, in our error shape, for a 4xx/5xx that has no body.
StatusText TextFor(int status) {
  switch (status) {
    case 400:
      return {"bad_request", "the request could not be parsed"};
    case 401:
      return {"unauthorized", "a valid credential is required"};
    case 404:
      return {"not_found", "no such resource"};
    case 405:
      return {"method_not_allowed", "method not allowed on this resource"};
    case 408:
      return {"request_timeout", "the request was not received in time"};
    case 413:
      return {"payload_too_large", "the body is too large"};
    case 414:
      return {"uri_too_long", "the request URI is too long"};
    case 415:
      return {"unsupported_media_type", "unsupported media type"};
    case 431:
      return {"request_header_fields_too_large", "the request header is too large"};
    case 503:
      return {"unavailable", "temporarily unavailable; retry later"};
    default:
      if (status >= 500) return {"internal_error", "internal error"};
      return {"bad_request", "the request was refused"};
  }
}

bool HasLineBreak(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

// The response as bytes. The server owns framing: Content-Length, Connection and
// Transfer-Encoding set by a handler are replaced.
std::string Serialize(const httplib::Response& res, bool head, bool keep_alive) {
  auto status = bhttp::int_to_status(static_cast<unsigned>(res.status));
  auto reason = status == bhttp::status::unknown ? boost::beast::string_view("Unknown")
                                                 : bhttp::obsolete_reason(status);
  std::string out;
  out.reserve(256 + (head ? 0 : res.body.size()));
  out.append("HTTP/1.1 ").append(std::to_string(res.status)).append(" ");
  out.append(reason.data(), reason.size()).append("\r\n");
  for (const auto& [name, value] : res.headers) {
    if (name.empty() || IEquals(name, "Content-Length") || IEquals(name, "Connection") ||
        IEquals(name, "Transfer-Encoding") || IEquals(name, kCloseMarker) ||
        IEquals(name, kDeferMarker)) {
      continue;
    }
    if (HasLineBreak(name) || HasLineBreak(value)) continue;  // no response splitting
    out.append(name).append(": ").append(value).append("\r\n");
  }
  bool bodiless = res.status < 200 || res.status == 204 || res.status == 304;
  if (!bodiless) out.append("Content-Length: ").append(std::to_string(res.body.size()));
  if (!bodiless) out.append("\r\n");
  out.append(keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n");
  if (!head && !bodiless) out.append(res.body);
  return out;
}

httplib::Response ErrorResponse(int status, std::string_view code, std::string_view message) {
  httplib::Response res;
  SetError(res, status, code, message);
  if (status == 503) res.set_header("Retry-After", "1");
  return res;
}

// The one catch point for a handler's exception: answered by what it means (SetFailure).
void AnswerException(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
  res = httplib::Response();
  auto failure = SetFailure(res, ep);
  const char* event = failure.kind == pg::Failure::kUnavailable     ? "handler_database_unavailable"
                      : failure.kind == pg::Failure::kRejectedValue ? "handler_value_rejected"
                                                                    : "handler_exception";
  Log(event, {{"method", req.method},
              {"path", req.path},
              {"sqlstate", failure.sqlstate},
              {"error", failure.what}});
}

// A fixed set of threads for blocking handlers behind a bounded queue. TryPush refuses
// instead of waiting: the event loop must never block, and an unbounded queue would turn
// overload into memory and latency instead of a quick 503.
class WorkerPool {
 public:
  WorkerPool(size_t threads, size_t queue)
      : threads_(std::max<size_t>(1, threads)), queue_(queue) {}
  ~WorkerPool() { Finish(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Start(const void* owner) {
    for (size_t i = 0; i < threads_; ++i) {
      workers_.emplace_back([this, owner] {
        current_owner_ = owner;
        Work();
      });
    }
  }

  // Accepts while the jobs running and waiting fit the workers plus the queue. (Counting
  // jobs, not idle workers: a worker that has not woken up yet is still a free one.)
  bool TryPush(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (shutdown_ || running_ + jobs_.size() >= threads_ + queue_) return false;
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
    return true;
  }

  // Runs what is queued, then joins.
  void Finish() {
    {
      std::lock_guard lock(mutex_);
      shutdown_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  static bool OnWorkerOf(const void* owner) { return current_owner_ == owner; }

 private:
  void Work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shut down and drained
        job = std::move(jobs_.front());
        jobs_.pop_front();
        ++running_;
      }
      job();
      job = nullptr;  // what it holds goes now, not after the next wait
      std::lock_guard lock(mutex_);
      --running_;
    }
  }

  static thread_local const void* current_owner_;
  const size_t threads_;
  const size_t queue_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  size_t running_ = 0;
  bool shutdown_ = false;
};

thread_local const void* WorkerPool::current_owner_ = nullptr;

struct Route {
  std::string method;
  std::string pattern;
  std::regex regex;
  Server::Handler handler;
};

// One request and its response, on the heap so that `req.matches` (iterators into
// `route_path`) stay valid while it travels from the loop to a worker and back.
struct Exchange {
  httplib::Request req;
  std::string route_path;  // what routes match: see server.hpp
  httplib::Response res;
  const Route* route = nullptr;
  bool head = false;
  bool keep_alive = false;
  // Set once by whoever answers: the handler's return or an EarlyAnswer. `early` is written
  // only by the EarlyAnswer that set it, before it hands the exchange to the loop.
  std::atomic<bool> answered{false};
  httplib::Response early;
  // A deferred answer's connection, kept alive by the exchange (which its EarlyAnswer holds)
  // until the answer has gone: no pending operation holds it meanwhile.
  std::shared_ptr<void> deferred_connection;
};

// The EarlyAnswer of the request this worker's handler runs for.
thread_local const EarlyAnswer* current_early_answer = nullptr;

class Connection;

}  // namespace

namespace detail {

// Everything behind Server; the loop's state is touched on the loop only (the acceptor's
// strand, each connection's strand); `stopping`, `live` and the registry are shared.
class ServerCore {
 public:
  explicit ServerCore(Limits l) : limits(std::move(l)), pool(limits.threads, limits.queue) {}

  int Bind(const std::string& host, int port);
  bool Serve();
  void Stop();

  void AddRoute(std::string method, const std::string& pattern, Server::Handler handler);
  void Accept();
  void OnAccept(error_code ec, tcp::socket socket);
  void BeginStop();
  void ReleaseWork();
  void Register(const std::shared_ptr<Connection>& c);
  void Unregister(Connection* c);
  // Finds the route (true) or fills the 404/405 answer (false).
  bool FindRoute(Exchange& ex) const;
  // On a worker: the handler, its exception, the defaults.
  void Run(Exchange& ex) const;
  // The defaults of a handler's answer: a status, an error body for an error status.
  static void Complete(const httplib::Request& req, httplib::Response& res);
  void RunLoop();

  const Limits limits;
  // First registered wins, as with httplib. A deque keeps `Exchange::route` valid, and the
  // lock lets a route be added while serving (tests do; services register before Serve).
  std::deque<Route> routes;
  mutable std::shared_mutex routes_mutex;
  asio::io_context ioc;
  asio::strand<asio::io_context::executor_type> accept_strand{ioc.get_executor()};
  tcp::acceptor acceptor{accept_strand};
  asio::steady_timer accept_pause{accept_strand};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::atomic<bool> work_released{false};
  WorkerPool pool;
  std::atomic<size_t> live{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stop_requested{false};
  std::mutex registry_mutex;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> registry;
  std::mutex serve_mutex;
  std::condition_variable serve_cv;
  bool serving = false;
};

}  // namespace detail

using detail::ServerCore;

namespace {

// One client connection, driven on its strand: wait for a request (idle deadline), read its
// header (header deadline) and body (body deadline), hand it to a worker, write the answer
// (write deadline), then wait again or close.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore& server, tcp::socket socket)
      : server_(server),
        socket_(std::move(socket)),
        executor_(socket_.get_executor()),
        timer_(executor_),
        // A header never needs more than its limit (the parser consumes whole field lines
        // as they come); the body streams through.
        buffer_(server.limits.max_header_bytes + kReadChunk) {
    ++server_.live;
    error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    if (!ec) remote_ = {remote.address().to_string(), remote.port()};
    auto local = socket_.local_endpoint(ec);
    if (!ec) local_ = {local.address().to_string(), local.port()};
  }

  ~Connection() {
    server_.Unregister(this);
    if (--server_.live == 0 && server_.stopping) server_.ReleaseWork();
  }

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const asio::any_io_executor& executor() const { return executor_; }

  void Start() {
    if (server_.stopping) return Close();
    // A new connection's first byte counts against the header deadline.
    WaitForRequest(std::chrono::seconds(server_.limits.header_timeout_s));
  }

  // Stop(): what is not being answered closes now; what is, closes after its answer.
  void OnStop() {
    switch (phase_) {
      case Phase::kHandling:
      case Phase::kWriting:
        close_after_write_ = true;
        return;
      default:
        return Close();
    }
  }

  void OnHandled(const Exchange& ex, const httplib::Response& res) {
    if (phase_ != Phase::kHandling) return;
    if (res.has_header(kCloseMarker)) return Close();
    Respond(ex, res);
  }

  // From any thread, once per exchange at most (Exchange::answered decides who answers).
  bool AnswerEarly(const std::shared_ptr<Exchange>& ex, httplib::Response res) {
    if (ex->answered.exchange(true)) return false;
    ServerCore::Complete(ex->req, res);
    ex->early = std::move(res);
    asio::post(executor_, [self = shared_from_this(), ex] { self->OnHandled(*ex, ex->early); });
    return true;
  }

 private:
  enum class Phase { kIdle, kHeader, kBody, kHandling, kWriting, kLinger, kClosed };

  // Waits for the first byte without a buffer: an idle connection holds no read buffer.
  void WaitForRequest(std::chrono::seconds idle) {
    phase_ = Phase::kIdle;
    parser_.reset();
    if (buffer_.size() > 0) return BeginRequest();  // pipelined
    buffer_.shrink_to_fit();
    Arm(idle);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (self->phase_ != Phase::kIdle) return;
      // Idle too long, stopped, or gone: there is no request to answer.
      if (ec || self->timed_out_) return self->Close();
      self->BeginRequest();
    });
  }

  void BeginRequest() {
    phase_ = Phase::kHeader;
    parser_.emplace(server_.limits);
    Arm(std::chrono::seconds(server_.limits.header_timeout_s));
    Parse();
  }

  void Parse() {
    try {
      ParseOrThrow();
    } catch (const std::exception& e) {  // a bug (or bad_alloc): this connection ends, not the loop
      Log("http_connection_exception", {{"error", e.what()}});
      Close();
    }
  }

  void ParseOrThrow() {
    for (;;) {
      auto data = buffer_.data();
      size_t used = 0;
      auto progress =
          parser_->Feed(std::string_view(static_cast<const char*>(data.data()), data.size()), used);
      buffer_.consume(used);
      switch (progress) {
        case RequestParser::Progress::kNeedMore:
          return Read();
        case RequestParser::Progress::kRefused:
          return Refuse(parser_->refusal());
        case RequestParser::Progress::kDone:
          return Dispatch();
        case RequestParser::Progress::kHeaderDone:
          phase_ = Phase::kBody;
          if (parser_->done()) continue;
          Arm(std::chrono::seconds(server_.limits.body_timeout_s));
          if (parser_->expects_continue()) return SendContinue();
          continue;
      }
    }
  }

  void Read() {
    size_t room = buffer_.max_size() - buffer_.size();
    if (room == 0) {  // unreachable: the parser refuses a header before it fills the buffer
      return Refuse({431, "request_header_fields_too_large", "the request header is too large"});
    }
    socket_.async_read_some(
        buffer_.prepare(std::min(room, kReadChunk)),
        [self = shared_from_this()](error_code ec, size_t n) { self->OnRead(ec, n); });
  }

  void OnRead(error_code ec, size_t n) {
    if (phase_ != Phase::kHeader && phase_ != Phase::kBody) return;
    if (timed_out_) {
      return Refuse({408, "request_timeout",
                     phase_ == Phase::kHeader ? "the header was not received in time"
                                              : "the body was not received in time"});
    }
    if (ec == asio::error::eof) {
      if (parser_->FeedEof() == RequestParser::Progress::kRefused) {
        return Refuse(parser_->refusal());
      }
      return Close();
    }
    if (ec) return Close();
    buffer_.commit(n);
    Parse();
  }

  void SendContinue() {
    out_ = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](error_code ec, size_t) {
                        if (self->phase_ != Phase::kBody) return;
                        if (ec || self->timed_out_) return self->Close();
                        self->Parse();
                      });
  }

  void Dispatch() {
    Disarm();
    phase_ = Phase::kHandling;
    auto ex = std::make_shared<Exchange>();
    ex->keep_alive = parser_->keep_alive() && served_ + 1 < server_.limits.keep_alive_max_count;
    ex->req = std::move(parser_->request());
    parser_.reset();
    ex->req.remote_addr = remote_.first;
    ex->req.remote_port = remote_.second;
    ex->req.local_addr = local_.first;
    ex->req.local_port = local_.second;
    ex->head = ex->req.method == "HEAD";
    if (!server_.FindRoute(*ex)) return Respond(*ex, ex->res);
    auto self = shared_from_this();
    auto queued_at = std::chrono::steady_clock::now();
    bool admitted = server_.pool.TryPush([self, ex, queued_at] {
      if (std::chrono::steady_clock::now() - queued_at > self->server_.limits.queue_timeout) {
        ex->res = ErrorResponse(503, "unavailable",
                                "the server is at capacity; retrying with the same key is safe");
      } else {
        EarlyAnswer early([weak = std::weak_ptr<Connection>(self), ex](httplib::Response res) {
          auto c = weak.lock();
          return c != nullptr && c->AnswerEarly(ex, std::move(res));
        });
        current_early_answer = &early;
        self->server_.Run(*ex);
        current_early_answer = nullptr;
      }
      if (ex->res.has_header(kDeferMarker)) {  // its EarlyAnswer answers, now or later
        ex->deferred_connection = self;
        return;
      }
      if (ex->answered.exchange(true)) return;  // an early answer went instead
      asio::post(self->executor_, [self, ex] { self->OnHandled(*ex, ex->res); });
    });
    if (!admitted) {
      ex->res = ErrorResponse(503, "unavailable",
                              "the server is at capacity; retrying with the same key is safe");
      Respond(*ex, ex->res);
    }
  }

  void Respond(const Exchange& ex, const httplib::Response& res) {
    bool keep = ex.keep_alive && !close_after_write_ && !server_.stopping &&
                !IEquals(res.get_header_value("Connection"), "close");
    Write(Serialize(res, ex.head, keep), keep);
  }

  // Answers a request the server refuses itself, then closes: after a framing error the
  // start of the next request cannot be known.
  void Refuse(const Refusal& refusal) {
    // Serialised first: `refusal` may live in the parser.
    auto answer =
        Serialize(ErrorResponse(refusal.status, refusal.code, refusal.message), false, false);
    parser_.reset();
    refused_ = true;
    Write(std::move(answer), false);
  }

  void Write(std::string bytes, bool keep_alive) {
    phase_ = Phase::kWriting;
    out_ = std::move(bytes);
    keep_after_write_ = keep_alive;
    Arm(std::chrono::seconds(server_.limits.write_timeout_s));
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(error_code ec) {
    if (phase_ != Phase::kWriting) return;
    Disarm();
    if (ec || timed_out_) return Close();
    ++served_;
    std::string().swap(out_);
    if (!keep_after_write_ || close_after_write_ || server_.stopping) return Linger();
    WaitForRequest(std::chrono::seconds(server_.limits.keep_alive_timeout_s));
  }

  void Linger() {
    phase_ = Phase::kLinger;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    // A complete request and nothing unread: a plain close sends the answer, then FIN.
    if (ec || (!refused_ && socket_.available(ec) == 0)) return Close();
    buffer_.clear();
    lingered_ = 0;
    Arm(kLingerTime);
    Drain();
  }

  void Drain() {
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (self->phase_ != Phase::kLinger) return;
                              self->lingered_ += n;
                              if (ec || self->timed_out_ || self->lingered_ > kLingerBytes) {
                                return self->Close();
                              }
                              self->Drain();
                            });
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    Disarm();
    parser_.reset();
    error_code ec;
    socket_.close(ec);
  }

  // One deadline at a time. On expiry the pending operation is cancelled and its handler,
  // seeing timed_out_, decides: 408 for a request half received, a plain close otherwise.
  void Arm(std::chrono::steady_clock::duration after) {
    timed_out_ = false;
    unsigned generation = ++timer_generation_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), generation](error_code ec) {
      if (ec || generation != self->timer_generation_) return;
      self->timed_out_ = true;
      if (self->phase_ == Phase::kClosed || self->phase_ == Phase::kHandling) return;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }

  void Disarm() {
    ++timer_generation_;
    timer_.cancel();
  }

  ServerCore& server_;
  tcp::socket socket_;
  const asio::any_io_executor executor_;
  asio::steady_timer timer_;
  boost::beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;
  std::string out_;
  std::pair<std::string, int> remote_{"", -1}, local_{"", -1};
  Phase phase_ = Phase::kIdle;
  unsigned timer_generation_ = 0;
  size_t served_ = 0;
  size_t lingered_ = 0;
  bool timed_out_ = false;
  bool keep_after_write_ = false;
  bool close_after_write_ = false;
  bool refused_ = false;  // the client may still be sending the request we refused
};

}  // namespace

namespace detail {

int ServerCore::Bind(const std::string& host, int port) {
  error_code ec;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) return -1;
  for (const auto& entry : results) {
    auto endpoint = entry.endpoint();
    acceptor.open(endpoint.protocol(), ec);
    if (ec) continue;
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(limits.backlog, ec);
    if (!ec) {
      auto bound = acceptor.local_endpoint(ec);
      if (!ec) return bound.port();
    }
    error_code ignored;
    acceptor.close(ignored);
  }
  return -1;
}

bool ServerCore::Serve() {
  {
    std::lock_guard lock(serve_mutex);
    if (stop_requested) return true;
    if (!acceptor.is_open()) return false;
    serving = true;
  }
  work.emplace(ioc.get_executor());
  pool.Start(this);
  asio::post(accept_strand, [this] { Accept(); });
  std::vector<std::thread> loops;
  for (size_t i = 1; i < limits.io_threads; ++i) loops.emplace_back([this] { RunLoop(); });
  RunLoop();
  for (auto& t : loops) t.join();
  pool.Finish();  // idle by now: every queued job holds a connection, and none is left
  {
    std::lock_guard lock(serve_mutex);
    serving = false;
  }
  serve_cv.notify_all();
  return true;
}

void ServerCore::RunLoop() {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {  // a bug in a completion handler; keep serving
      Log("http_loop_exception", {{"error", e.what()}});
    }
  }
}

void ServerCore::Stop() {
  if (!stop_requested.exchange(true)) asio::post(accept_strand, [this] { BeginStop(); });
  if (WorkerPool::OnWorkerOf(this)) return;
  std::unique_lock lock(serve_mutex);
  serve_cv.wait(lock, [&] { return !serving; });
}

void ServerCore::BeginStop() {
  stopping = true;
  error_code ignored;
  acceptor.close(ignored);
  accept_pause.cancel();
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(registry_mutex);
    for (auto& [raw, weak] : registry) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) asio::post(c->executor(), [c] { c->OnStop(); });
  if (live == 0) ReleaseWork();
}

// With no connection left the loop has nothing more to do; run() returns once it is idle.
void ServerCore::ReleaseWork() {
  if (!work_released.exchange(true)) asio::post(accept_strand, [this] { work.reset(); });
}

void ServerCore::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void ServerCore::OnAccept(error_code ec, tcp::socket socket) {
  if (stopping || ec == asio::error::operation_aborted) return;
  if (ec) {
    // Out of descriptors or memory: accepting again at once would spin. Pause; the kernel
    // backlog holds the clients meanwhile.
    int e = ec.value();
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
      Log("http_accept_paused", {{"error", ec.message()}});
      accept_pause.expires_after(std::chrono::milliseconds(100));
      accept_pause.async_wait([this](error_code wait) {
        if (!wait && !stopping) Accept();
      });
      return;
    }
    return Accept();  // the client gave up before we accepted it
  }
  if (live >= limits.max_connections) {
    // Over the cap: a best-effort 503 (the socket buffer takes it without blocking), closed.
    static const std::string kBusy = Serialize(
        ErrorResponse(503, "unavailable", "too many connections; retry later"), false, false);
    error_code ignored;
    socket.non_blocking(true, ignored);
    asio::write(socket, asio::buffer(kBusy), ignored);
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    return Accept();
  }
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto connection = std::make_shared<Connection>(*this, std::move(socket));
  Register(connection);
  asio::dispatch(connection->executor(), [connection] { connection->Start(); });
  Accept();
}

void ServerCore::Register(const std::shared_ptr<Connection>& c) {
  std::lock_guard lock(registry_mutex);
  registry.emplace(c.get(), c);
}

void ServerCore::Unregister(Connection* c) {
  std::lock_guard lock(registry_mutex);
  registry.erase(c);
}

bool ServerCore::FindRoute(Exchange& ex) const {
  // The parser has validated the target's escapes: this cannot fail.
  std::string_view target = ex.req.target;
  detail::PercentDecode(target.substr(0, target.find('?')), false, ex.route_path, "/%");
  const std::string& method = ex.head ? std::string("GET") : ex.req.method;
  std::shared_lock lock(routes_mutex);
  try {
    for (const auto& route : routes) {
      if (route.method == method && std::regex_match(ex.route_path, ex.req.matches, route.regex)) {
        ex.route = &route;
        return true;
      }
    }
    std::string allow;
    std::smatch ignored;
    for (const auto& route : routes) {
      if (allow.find(route.method) == std::string::npos &&
          std::regex_match(ex.route_path, ignored, route.regex)) {
        if (!allow.empty()) allow += ", ";
        allow += route.method == "GET" ? "GET, HEAD" : route.method;
      }
    }
    if (allow.empty()) {
      SetError(ex.res, 404, "not_found", "no such resource");
    } else {
      SetError(ex.res, 405, "method_not_allowed", "method not allowed on this resource");
      ex.res.set_header("Allow", allow);
    }
  } catch (const std::exception& e) {  // std::regex_error: a bug in a route's pattern
    Log("http_route_exception", {{"path", ex.req.path}, {"error", e.what()}});
    ex.res = ErrorResponse(500, "internal_error", "internal error");
  }
  return false;
}

void ServerCore::Run(Exchange& ex) const {
  try {
    ex.route->handler(ex.req, ex.res);
  } catch (...) {
    AnswerException(ex.req, ex.res, std::current_exception());
  }
  Complete(ex.req, ex.res);
}

void ServerCore::Complete(const httplib::Request& req, httplib::Response& res) {
  if (res.status == -1) res.status = 200;
  if (res.status < 100 || res.status > 999) {
    Log("handler_bad_status", {{"path", req.path}, {"status", std::to_string(res.status)}});
    res = ErrorResponse(500, "internal_error", "internal error");
  }
  if (res.status >= 400 && res.body.empty()) {
    auto text = TextFor(res.status);
    SetError(res, res.status, text.code, text.message);
  }
}

}  // namespace detail

EarlyAnswer EarlyAnswer::ForCurrentRequest() {
  return current_early_answer != nullptr ? *current_early_answer : EarlyAnswer();
}

Server::Server(Limits limits) : impl_(std::make_unique<detail::ServerCore>(std::move(limits))) {}

Server::~Server() { Stop(); }

void detail::ServerCore::AddRoute(std::string method, const std::string& pattern,
                                  Server::Handler handler) {
  std::regex regex(pattern);  // throws std::regex_error on a bad pattern, before the lock
  std::unique_lock lock(routes_mutex);
  routes.push_back({std::move(method), pattern, std::move(regex), std::move(handler)});
}

std::vector<Server::RouteInfo> Server::Routes() const {
  std::shared_lock lock(impl_->routes_mutex);
  std::vector<RouteInfo> out;
  for (const auto& r : impl_->routes) out.push_back({r.method, r.pattern});
  return out;
}

Server& Server::Get(const std::string& pattern, Handler handler) {
  impl_->AddRoute("GET", pattern, std::move(handler));
  return *this;
}
Server& Server::Post(const std::string& pattern, Handler handler) {
  impl_->AddRoute("POST", pattern, std::move(handler));
  return *this;
}
Server& Server::Put(const std::string& pattern, Handler handler) {
  impl_->AddRoute("PUT", pattern, std::move(handler));
  return *this;
}

const Limits& Server::limits() const { return impl_->limits; }

int Server::Bind(const std::string& host, int port) { return impl_->Bind(host, port); }

bool Server::Serve() { return impl_->Serve(); }

void Server::Stop() { impl_->Stop(); }

void SetError(httplib::Response& res, int status, std::string_view code, std::string_view message) {
  res.status = status;
  res.set_content(ProblemBody(status, code, message), kProblemContentType);
}

void DeferAnswer(httplib::Response& res) { res.set_header(kDeferMarker, "1"); }

void CloseWithoutResponse(httplib::Response& res) {
  res.status = 500;
  res.set_header(kCloseMarker, "1");
}

namespace {

// Any member name or string, at any depth (bounded by the parser's depth limit), with a NUL.
bool HoldsNul(const nlohmann::json& j) {
  if (j.is_string()) return j.get_ref<const std::string&>().find('\0') != std::string::npos;
  if (j.is_array())
    return std::any_of(j.begin(), j.end(), [](const auto& e) { return HoldsNul(e); });
  if (j.is_object()) {
    for (const auto& [name, value] : j.items()) {
      if (name.find('\0') != std::string::npos || HoldsNul(value)) return true;
    }
  }
  return false;
}

}  // namespace

std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits, NulInJson nul) {
  auto type = req.get_header_value("Content-Type");
  auto semicolon = type.find(';');
  std::string media = type.substr(0, semicolon);
  while (!media.empty() && media.back() == ' ') media.pop_back();
  for (auto& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (media != "application/json") {
    SetError(res, 415, "unsupported_media_type", "Content-Type must be application/json");
    return std::nullopt;
  }
  size_t limit = BodyLimitFor(limits, req.path);
  if (req.body.size() > limit) {
    SetError(res, 413, "payload_too_large",
             "the body is larger than " + std::to_string(limit) + " bytes");
    return std::nullopt;
  }
  bool too_deep = false;
  auto depth_guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > limits.max_json_depth) too_deep = true;
    return !too_deep;
  };
  try {
    // A callback that refuses an element discards it rather than throwing; hence the flag.
    auto body = nlohmann::json::parse(req.body, depth_guard);
    if (too_deep) {
      SetError(res, 400, "invalid_json",
               "the JSON body nests deeper than " + std::to_string(limits.max_json_depth));
    } else if (nul == NulInJson::kRefuse && HoldsNul(body)) {
      // PostgreSQL stores no U+0000 in text or jsonb: refused here, once for every route,
      // rather than failing later as if the database were down.
      SetError(res, 400, "invalid_json",
               "a string in the body holds U+0000 (\\u0000), which is not accepted");
    } else {
      return body;
    }
  } catch (const nlohmann::json::exception&) {
    SetError(res, 400, "invalid_json", "the body is not valid JSON");
  }
  return std::nullopt;
}

pg::ClassifiedFailure SetFailure(httplib::Response& res, const std::exception_ptr& ep) {
  auto failure = pg::Classify(ep);
  switch (failure.kind) {
    case pg::Failure::kUnavailable:
      SetUnavailable(res, "the database is unavailable");
      break;
    case pg::Failure::kRejectedValue:
      // Not an outage: the same request would fail the same way, so no Retry-After and no
      // promise that a retry helps. Nothing was stored (the transaction rolled back).
      SetError(res, 500, "internal_error",
               "the database refused a value of this request (SQLSTATE " + failure.sqlstate +
                   "); nothing was stored, and sending it again fails the same way");
      break;
    case pg::Failure::kDefect:
      SetError(res, 500, "internal_error", "internal error; retrying with the same key is safe");
      break;
  }
  return failure;
}

void SetUnavailable(httplib::Response& res, const std::string& what) {
  SetError(res, 503, "unavailable", what + "; retrying with the same key is safe");
  res.set_header("Retry-After", "1");
}

void AddHealthRoutes(Server& server, pg::Pool& pool) {
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/readyz", [&pool](const httplib::Request&, httplib::Response& res) {
    try {
      pool.With([](pqxx::connection& conn) {
        pqxx::nontransaction tx(conn);
        tx.exec("SELECT 1");
      });
      res.set_content(R"({"status":"ready"})", "application/json");
    } catch (const std::exception&) {
      SetUnavailable(res, "the database is not reachable");
    }
  });
}

std::string BearerToken(const httplib::Request& req) {
  auto value = req.get_header_value("Authorization");
  constexpr std::string_view kScheme = "bearer";
  if (value.size() <= kScheme.size() + 1 ||
      !IEquals(std::string_view(value).substr(0, kScheme.size()), kScheme) ||
      value[kScheme.size()] != ' ') {
    return "";
  }
  auto token = value.find_first_not_of(' ', kScheme.size());
  return token == std::string::npos ? "" : value.substr(token);
}

std::string DecodeCapture(std::string_view capture) {
  // The route path holds no escape but %2F and %25 (FindRoute): a plain decode is exact.
  std::string out;
  detail::PercentDecode(capture, false, out);
  return out;
}

}  // namespace common::http
