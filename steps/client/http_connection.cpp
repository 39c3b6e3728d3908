#include "steps/client/http_connection.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "common/net.hpp"

namespace idemsaga::steps::client {
namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

// A participant's answer is a small JSON document; this is far beyond any of ours.
constexpr uint64_t kMaxBody = 8 << 20;
constexpr uint32_t kMaxHeader = 64 << 10;
constexpr size_t kReadChunk = 16 << 10;

// Milliseconds left until `deadline`, at least 0, for poll(2).
int MillisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<long long>(0, left.count()));
}

// Waits for `events` on `fd` until `deadline`: false on timeout or error.
bool Wait(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

std::pair<std::string, int> ParseHttpBaseUrl(const std::string& base_url) {
  constexpr std::string_view kScheme = "http://";
  if (base_url.rfind(kScheme, 0) != 0) {
    throw std::invalid_argument("a participant URL must start with http://: " + base_url);
  }
  std::string rest = base_url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.find('/') != std::string::npos) {
    throw std::invalid_argument("a participant URL is http://host[:port]: " + base_url);
  }
  if (rest.find(':') == std::string::npos) return {rest, 80};
  return common::SplitHostPort(rest);
}

HttpConnection::HttpConnection(std::string host, int port) : host_(std::move(host)), port_(port) {}

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  reusable_ = false;
}

bool HttpConnection::Connect(std::chrono::milliseconds timeout, std::string& error) {
  const auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(port_);
  if (int rc = ::getaddrinfo(host_.c_str(), port.c_str(), &hints, &found); rc != 0) {
    error = "Connection: " + host_ + ": " + ::gai_strerror(rc);
    return false;
  }
  error = "Connection: no address for " + host_;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = Errno("Connection: socket");
      continue;
    }
    bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!connected && errno == EINPROGRESS) {
      int so_error = 0;
      socklen_t len = sizeof so_error;
      if (!Wait(fd, POLLOUT, deadline)) {
        error = "ConnectionTimeout: " + host_ + ":" + port;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
        error = Errno("Connection: getsockopt");
      } else if (so_error != 0) {
        error = "Connection: " + host_ + ":" + port + ": " + std::strerror(so_error);
      } else {
        connected = true;
      }
    } else if (!connected) {
      error = Errno("Connection");
    }
    if (!connected) {
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fd_ = fd;
    break;
  }
  ::freeaddrinfo(found);
  return fd_ >= 0;
}

bool HttpConnection::Send(std::string_view bytes, Clock::time_point deadline, std::string& error) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!Wait(fd_, POLLOUT, deadline)) {
        error = "Write: timeout";
        return false;
      }
    } else {
      error = n == 0 ? std::string("Write: nothing written") : Errno("Write");
      return false;
    }
  }
  return true;
}

bool HttpConnection::Receive(Clock::time_point deadline, Answer& answer, std::string& error) {
  std::optional<http::response_parser<http::string_body>> parser;
  auto fresh = [&parser] {
    parser.emplace();
    parser->header_limit(kMaxHeader);
    parser->body_limit(kMaxBody);
    parser->eager(true);
  };
  fresh();
  std::string buffer;
  size_t start = 0;  // bytes of `buffer` the parser has taken
  bool closed = false;
  char chunk[kReadChunk];
  for (;;) {
    // Feed what is buffered: the parser wants a whole header in one piece, so an incomplete one
    // waits for more bytes.
    while (start < buffer.size() && !parser->is_done()) {
      boost::beast::error_code ec;
      size_t used =
          parser->put(boost::asio::buffer(buffer.data() + start, buffer.size() - start), ec);
      start += used;
      if (ec == http::error::need_more) break;
      if (ec) {
        error = "Read: malformed answer: " + ec.message();
        return false;
      }
      if (used == 0) break;
    }
    if (parser->is_done()) {
      const unsigned status = parser->get().result_int();
      if (status == 101) {
        error = "Read: the participant switched protocols";
        return false;
      }
      // An interim answer (RFC 9110 §15.2: a client accepts one it did not ask for): the
      // final one follows on the same connection.
      if (status / 100 != 1) break;
      fresh();
      continue;
    }
    buffer.erase(0, start);
    start = 0;
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n > 0) {
      buffer.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      // Closed: the end of an answer that runs to the close, else a cut one.
      closed = true;
      boost::beast::error_code ec;
      if (parser->is_header_done() && !parser->is_done()) parser->put_eof(ec);
      if (!parser->is_done() || ec || parser->get().result_int() / 100 == 1) {
        error = "Read: the connection closed before the answer was complete";
        return false;
      }
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      error = Errno("Read");
      return false;
    }
    if (!Wait(fd_, POLLIN, deadline)) {
      error = "Read: timeout";
      return false;
    }
  }
  // Bytes past the answer would be the start of an answer to nothing we asked.
  reusable_ = parser->keep_alive() && !closed && start == buffer.size();
  auto& message = parser->get();
  answer.status = static_cast<int>(message.result_int());
  answer.replayed = std::string(message["Idempotent-Replayed"]);
  answer.retry_after = std::string(message["Retry-After"]);
  answer.body = std::move(message.body());
  return true;
}

HttpConnection::Failure HttpConnection::Exchange(std::string_view request,
                                                 std::chrono::milliseconds connect_timeout,
                                                 std::chrono::milliseconds read_timeout,
                                                 Answer& answer, std::string& error) {
  // A kept-alive connection the participant has closed meanwhile (its keep-alive timeout)
  // would take the request and answer nothing: "in doubt" for no reason. Readable while idle
  // means closed (or stray bytes): a new connection instead.
  if (fd_ >= 0) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) != 0) Close();
  }
  if (fd_ < 0 && !Connect(connect_timeout, error)) return Failure::kConnect;
  reusable_ = false;
  const auto deadline = Clock::now() + read_timeout;
  if (!Send(request, deadline, error)) {
    Close();
    return Failure::kSend;
  }
  if (!Receive(deadline, answer, error)) {
    Close();
    return Failure::kReceive;
  }
  if (!reusable_) Close();
  return Failure::kNone;
}

}  // namespace idemsaga::steps::client
