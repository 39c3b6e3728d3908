// One HTTP/1.1 request from bytes to an httplib::Request, under the server's Limits, with
// header values exactly as sent. The socket-free half of common::http::Server (it is also what
// the request-parsing fuzzer drives).
//
// Contract: feed bytes as they arrive; Feed says how many it consumed (keep the rest and
// append to it) and what happened. kHeaderDone is reported once, before any body byte is
// consumed, so the caller can refuse early or send `100 Continue`; feed again to go on.
// kRefused leaves the reason in refusal(): the server answers it and closes the connection,
// because after a framing error the next request's first byte cannot be found.
// Boost.Beast does the HTTP grammar; this adds what Beast 1.74 lacks or leaves to its user: a
// cumulative header byte limit (Beast's applies per unconsumed chunk), a field count limit,
// obs-fold refusal (Beast unfolds silently), Transfer-Encoding other than `chunked` refused,
// Content-Encoding refused, per-path body limits and the target rules in server.hpp.
// Thread-safety: one parser per request, used by one thread at a time.
//   RequestParser parser(limits); size_t used = 0;
//   if (parser.Feed(bytes, used) == RequestParser::Progress::kDone) Use(parser.request());
#pragma once

#include <httplib.h>

#include <boost/beast/http/basic_parser.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/http/server.hpp"
#include "common/strings.hpp"

namespace idemsaga::common::http {

// A request the server answers itself: status, and the error body's code and message.
struct Refusal {
  int status = 0;
  std::string code;
  std::string message;
};

class RequestParser final : private boost::beast::http::basic_parser<true> {
 public:
  enum class Progress { kNeedMore, kHeaderDone, kDone, kRefused };

  explicit RequestParser(const Limits& limits);

  // Parses from the start of `data` (bytes not consumed by an earlier call, then new ones).
  Progress Feed(std::string_view data, size_t& consumed);
  // The connection ended. Returns kRefused (400) if a request had begun, else kNeedMore.
  Progress FeedEof();

  bool started() const { return got_some(); }
  bool header_done() const { return is_header_done(); }
  bool done() const { return is_done(); }
  // Keep the connection after this request? Valid once the header is done.
  bool keep_alive() const { return basic_parser::keep_alive(); }
  // The client waits for `100 Continue` before sending the body it announced.
  bool expects_continue() const { return expects_continue_ && !is_done(); }
  // The request: the header once kHeaderDone, all of it once kDone.
  httplib::Request& request() { return req_; }
  const Refusal& refusal() const { return refusal_; }

 private:
  Progress Refuse(int status, std::string code, std::string message);
  void RefuseFromCallback(boost::beast::error_code& ec, int status, std::string code,
                          std::string message);
  Progress RefuseFor(const boost::beast::error_code& ec);
  bool SetTarget(std::string_view target);

  void on_request_impl(boost::beast::http::verb method, boost::beast::string_view method_str,
                       boost::beast::string_view target, int version,
                       boost::beast::error_code& ec) override;
  void on_response_impl(int code, boost::beast::string_view reason, int version,
                        boost::beast::error_code& ec) override;
  void on_field_impl(boost::beast::http::field name, boost::beast::string_view name_string,
                     boost::beast::string_view value, boost::beast::error_code& ec) override;
  void on_header_impl(boost::beast::error_code& ec) override;
  void on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                         boost::beast::error_code& ec) override;
  size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) override;
  void on_chunk_header_impl(std::uint64_t size, boost::beast::string_view extensions,
                            boost::beast::error_code& ec) override;
  size_t on_chunk_body_impl(std::uint64_t remain, boost::beast::string_view body,
                            boost::beast::error_code& ec) override;
  void on_finish_impl(boost::beast::error_code& ec) override;

  const Limits& limits_;
  httplib::Request req_;
  Refusal refusal_;
  size_t header_bytes_ = 0;  // consumed while the header was not done
  size_t fields_ = 0;
  size_t body_limit_ = 0;
  bool got_request_line_ = false;
  bool expects_continue_ = false;
};

namespace detail {
// Decodes %XX escapes (and `+` as a space when `plus_is_space`); false on a malformed escape.
// The escapes of the characters in `keep_encoded` stay, in upper case.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string& out,
                   std::string_view keep_encoded = {});

using common::IEquals;
bool IsValidUtf8(std::string_view s);
}  // namespace detail

}  // namespace idemsaga::common::http
