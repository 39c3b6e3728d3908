#include "common/http/wire.hpp"

#include <boost/beast/http/status.hpp>

#include "common/http/problem.hpp"
#include "common/http/request_parser.hpp"
#include "common/http/server.hpp"
#include "common/log.hpp"

namespace idemsaga::common::http {

namespace detail {

namespace bhttp = boost::beast::http;

namespace {

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

}  // namespace

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
  return res;
}

void Complete(const httplib::Request& req, httplib::Response& res) {
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

void SetError(httplib::Response& res, int status, std::string_view code, std::string_view message) {
  SetAnswer(res, ProblemAnswer(status, code, message));
}

void SetAnswer(httplib::Response& res, const Answer& answer) {
  res.status = answer.status;
  res.set_content(answer.body, answer.content_type);
  // Replaced, never added beside: a header the handler set first (a 503's Retry-After on a
  // bare status) is sent once.
  for (const auto& [name, value] : answer.headers) {
    res.headers.erase(name);
    res.set_header(name, value);
  }
}

void DeferAnswer(httplib::Response& res) { res.set_header(detail::kDeferMarker, "1"); }

void CloseWithoutResponse(httplib::Response& res) {
  res.status = 500;
  res.set_header(detail::kCloseMarker, "1");
}

}  // namespace idemsaga::common::http
