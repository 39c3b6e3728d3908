// One client connection of the server, driven on its strand: wait for a request (idle
// deadline), read its header (header deadline) and body (body deadline), hand it to a worker,
// write the answer (write deadline), then wait again or close. A handler may answer early
// (EarlyAnswer) or leave the answer for later (DeferAnswer); the connection then waits for it
// holding no worker. Internal to common/http (server.hpp is the public face).
#pragma once

#include <httplib.h>

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/http/request_parser.hpp"
#include "common/http/router.hpp"

namespace idemsaga::common::http::detail {

class ServerCore;

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

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerCore& server, boost::asio::ip::tcp::socket socket);
  ~Connection();

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const boost::asio::any_io_executor& executor() const { return executor_; }

  // On the connection's strand: from the acceptor, on Stop(), with a handler's answer.
  void Start();
  // Stop(): what is not being answered closes now; what is, closes after its answer.
  void OnStop();
  void OnHandled(const Exchange& ex, const httplib::Response& res);

  // From any thread, once per exchange at most (Exchange::answered decides who answers).
  bool AnswerEarly(const std::shared_ptr<Exchange>& ex, httplib::Response res);

 private:
  using error_code = boost::system::error_code;
  enum class Phase { kIdle, kHeader, kBody, kHandling, kWriting, kLinger, kClosed };

  // Reading a request: the idle wait, the header, the body.
  // Waits for the first byte without a buffer: an idle connection holds no read buffer.
  void WaitForRequest(std::chrono::seconds idle);
  void BeginRequest();
  void Parse();
  void ParseOrThrow();
  void Read();
  void OnRead(error_code ec, size_t n);
  void SendContinue();

  // Handing it to a worker (the handler may answer early, or defer), and answering.
  void Dispatch();
  void Respond(const Exchange& ex, const httplib::Response& res);
  // Answers a request the server refuses itself, then closes: after a framing error the
  // start of the next request cannot be known.
  void Refuse(const Refusal& refusal);
  void Write(std::string bytes, bool keep_alive);
  void OnWritten(error_code ec);

  // Closing: lingering over unread input, then the socket.
  void Linger();
  void Drain();
  void Close();

  // One deadline at a time. On expiry the pending operation is cancelled and its handler,
  // seeing timed_out_, decides: 408 for a request half received, a plain close otherwise.
  void Arm(std::chrono::steady_clock::duration after);
  void Disarm();

  ServerCore& server_;
  boost::asio::ip::tcp::socket socket_;
  const boost::asio::any_io_executor executor_;
  boost::asio::steady_timer timer_;
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

}  // namespace idemsaga::common::http::detail
