// The server's side of the wire format: the bytes of an answer (status line, headers,
// framing), the defaults of a handler's answer (a status, the error body of a bare 4xx/5xx),
// and the markers a handler sets on its response to ask its connection for something other
// than an answer (CloseWithoutResponse, DeferAnswer). Internal to common/http (server.hpp is
// the public face).
#pragma once

#include <httplib.h>

#include <string>
#include <string_view>

namespace idemsaga::common::http::detail {

// Set by CloseWithoutResponse and DeferAnswer; never sent (the connection closes instead, or
// waits for the request's EarlyAnswer).
inline constexpr const char* kCloseMarker = "X-Idemsaga-Close-Without-Response";
inline constexpr const char* kDeferMarker = "X-Idemsaga-Answer-Deferred";

// The response as bytes. The server owns framing: Content-Length, Connection and
// Transfer-Encoding set by a handler are replaced.
std::string Serialize(const httplib::Response& res, bool head, bool keep_alive);

// An error answer of the server's own; a 503 carries Retry-After.
httplib::Response ErrorResponse(int status, std::string_view code, std::string_view message);

// The defaults of a handler's answer: a status, an error body for an error status.
void Complete(const httplib::Request& req, httplib::Response& res);

}  // namespace idemsaga::common::http::detail
