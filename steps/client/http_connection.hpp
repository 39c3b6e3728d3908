// One kept-alive HTTP/1.1 connection to a participant, blocking, with deadlines: what
// HttpParticipantClient sends each call over. A request goes out in one write (request line,
// header and body together): cpp-httplib wrote the header and the body apart, two segments
// and two system calls for every call, which were a few percent of a busy stack's CPU. The
// answer is read with Boost.Beast's parser.
//
// Not thread-safe: one caller at a time (HttpParticipantClient lends each connection to one call).
//   HttpConnection c("127.0.0.1", 8081);
//   HttpConnection::Answer answer;
//   auto failure = c.Exchange(request_bytes, 1s, 5s, answer);
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace idemsaga::steps::client {

class HttpConnection {
 public:
  // The bytes of one answer as read off the connection (the two headers the client reads, as
  // sent); HttpExchange is what the client makes of it.
  struct Answer {
    int status = 0;
    std::string body;
    std::string replayed;     // Idempotent-Replayed, as sent
    std::string retry_after;  // Retry-After, as sent
  };
  enum class Failure {
    kNone,
    kConnect,  // no connection was made: nothing was sent
    kSend,     // the connection failed while sending: part or all of it may have arrived
    kReceive,  // sent, then no complete answer (timeout, reset, close, malformed)
  };

  HttpConnection(std::string host, int port);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Connects if not connected, sends `request` (a whole HTTP/1.1 request) and reads its
  // answer. After any failure the connection is closed; `error` says what happened.
  Failure Exchange(std::string_view request, std::chrono::milliseconds connect_timeout,
                   std::chrono::milliseconds read_timeout, Answer& answer, std::string& error);

  // The answer allowed another request on this connection.
  bool reusable() const { return fd_ >= 0 && reusable_; }

 private:
  bool Connect(std::chrono::milliseconds timeout, std::string& error);
  bool Send(std::string_view bytes, std::chrono::steady_clock::time_point deadline,
            std::string& error);
  bool Receive(std::chrono::steady_clock::time_point deadline, Answer& answer, std::string& error);
  void Close();

  std::string host_;
  int port_;
  int fd_ = -1;
  bool reusable_ = false;
};

// Splits "http://host[:port][/]" into host and port (80 by default); throws
// std::invalid_argument for anything else (https is not spoken here).
std::pair<std::string, int> ParseHttpBaseUrl(const std::string& base_url);

}  // namespace idemsaga::steps::client
