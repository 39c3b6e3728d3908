#include "common/http/connection.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

#include "common/http/server.hpp"
#include "common/http/server_core.hpp"
#include "common/http/wire.hpp"
#include "common/log.hpp"

namespace idemsaga::common::http {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kReadChunk = 4096;
// After an answer with `Connection: close`, read and drop what the client still sends for a
// while before closing: closing a socket with unread input sends a reset, which can destroy
// the answer (a 413 or 431) before the client reads it.
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kLingerBytes = size_t{4} << 20;

}  // namespace

namespace detail {

Connection::Connection(ServerCore& server, tcp::socket socket)
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

Connection::~Connection() {
  server_.Unregister(this);
  if (--server_.live == 0 && server_.stopping) server_.ReleaseWork();
}

void Connection::Start() {
  if (server_.stopping) return Close();
  // A new connection's first byte counts against the header deadline.
  WaitForRequest(std::chrono::seconds(server_.limits.header_timeout_s));
}

// Stop(): what is not being answered closes now; what is, closes after its answer.
void Connection::OnStop() {
  switch (phase_) {
    case Phase::kHandling:
    case Phase::kWriting:
      close_after_write_ = true;
      return;
    default:
      return Close();
  }
}

void Connection::OnHandled(const Exchange& ex, const httplib::Response& res) {
  if (phase_ != Phase::kHandling) return;
  if (res.has_header(kCloseMarker)) return Close();
  Respond(ex, res);
}

// From any thread, once per exchange at most (Exchange::answered decides who answers).
bool Connection::AnswerEarly(const std::shared_ptr<Exchange>& ex, httplib::Response res) {
  if (ex->answered.exchange(true)) return false;
  Complete(ex->req, res);
  ex->early = std::move(res);
  asio::post(executor_, [self = shared_from_this(), ex] { self->OnHandled(*ex, ex->early); });
  return true;
}

// Waits for the first byte without a buffer: an idle connection holds no read buffer.
void Connection::WaitForRequest(std::chrono::seconds idle) {
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

void Connection::BeginRequest() {
  phase_ = Phase::kHeader;
  parser_.emplace(server_.limits);
  Arm(std::chrono::seconds(server_.limits.header_timeout_s));
  Parse();
}

void Connection::Parse() {
  try {
    ParseOrThrow();
  } catch (const std::exception& e) {  // a bug (or bad_alloc): this connection ends, not the loop
    Log("http_connection_exception", {{"error", e.what()}});
    Close();
  }
}

void Connection::ParseOrThrow() {
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

void Connection::Read() {
  size_t room = buffer_.max_size() - buffer_.size();
  if (room == 0) {  // unreachable: the parser refuses a header before it fills the buffer
    return Refuse({431, "request_header_fields_too_large", "the request header is too large"});
  }
  socket_.async_read_some(
      buffer_.prepare(std::min(room, kReadChunk)),
      [self = shared_from_this()](error_code ec, size_t n) { self->OnRead(ec, n); });
}

void Connection::OnRead(error_code ec, size_t n) {
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

void Connection::SendContinue() {
  out_ = "HTTP/1.1 100 Continue\r\n\r\n";
  asio::async_write(socket_, asio::buffer(out_),
                    [self = shared_from_this()](error_code ec, size_t) {
                      if (self->phase_ != Phase::kBody) return;
                      if (ec || self->timed_out_) return self->Close();
                      self->Parse();
                    });
}

void Connection::Dispatch() {
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
  if (server_.RunFast(*ex)) return Respond(*ex, ex->res);
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
      self->server_.Run(*ex, early);
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

void Connection::Respond(const Exchange& ex, const httplib::Response& res) {
  bool keep = ex.keep_alive && !close_after_write_ && !server_.stopping &&
              !IEquals(res.get_header_value("Connection"), "close");
  Write(Serialize(res, ex.head, keep), keep);
}

// Answers a request the server refuses itself, then closes: after a framing error the
// start of the next request cannot be known.
void Connection::Refuse(const Refusal& refusal) {
  // Serialised first: `refusal` may live in the parser.
  auto answer =
      Serialize(ErrorResponse(refusal.status, refusal.code, refusal.message), false, false);
  parser_.reset();
  refused_ = true;
  Write(std::move(answer), false);
}

void Connection::Write(std::string bytes, bool keep_alive) {
  phase_ = Phase::kWriting;
  out_ = std::move(bytes);
  keep_after_write_ = keep_alive;
  Arm(std::chrono::seconds(server_.limits.write_timeout_s));
  asio::async_write(socket_, asio::buffer(out_),
                    [self = shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); });
}

void Connection::OnWritten(error_code ec) {
  if (phase_ != Phase::kWriting) return;
  Disarm();
  if (ec || timed_out_) return Close();
  ++served_;
  std::string().swap(out_);
  if (!keep_after_write_ || close_after_write_ || server_.stopping) return Linger();
  WaitForRequest(std::chrono::seconds(server_.limits.keep_alive_timeout_s));
}

void Connection::Linger() {
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

void Connection::Drain() {
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

void Connection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  Disarm();
  parser_.reset();
  error_code ec;
  socket_.close(ec);
}

// One deadline at a time. On expiry the pending operation is cancelled and its handler,
// seeing timed_out_, decides: 408 for a request half received, a plain close otherwise.
void Connection::Arm(std::chrono::steady_clock::duration after) {
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

void Connection::Disarm() {
  ++timer_generation_;
  timer_.cancel();
}

}  // namespace detail

}  // namespace idemsaga::common::http
