// libFuzzer harness for the request parsing path of idemsaga::common::http::Server (RequestParser,
// the socket-free half): any bytes, fed in the chunk sizes the input itself picks, as the server's
// connection feeds them (keep the unconsumed rest, append, feed again; a new parser for each
// pipelined request). Beyond "no crash, no leak, no UB" it checks what the server promises its
// routes and clients:
//   - a refusal is a 4xx (never a 5xx: a malformed request is the client's fault);
//   - a complete request has a path that starts with '/', holds no NUL and is valid UTF-8, and
//     so does every query parameter; its body fits the path's limit; it has at most
//     max_header_fields fields, and the header bytes consumed stay within max_header_bytes.
// Built only with -DIDEMSAGA_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt has the commands).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "common/http/request_parser.hpp"

namespace {

using idemsaga::common::http::Limits;
using idemsaga::common::http::RequestParser;

void Check(bool ok) {
  if (!ok) std::abort();
}

const Limits& FuzzLimits() {
  static const Limits limits = [] {
    Limits l;
    l.max_header_bytes = 2048;  // small, so that inputs reach the limits
    l.max_header_fields = 16;
    l.max_target_bytes = 512;
    l.max_body_bytes = 256;
    l.large_bodies["/big"] = 4096;
    return l;
  }();
  return limits;
}

void CheckRequest(RequestParser& parser, const Limits& limits) {
  const auto& req = parser.request();
  Check(!req.path.empty() && req.path.front() == '/');
  Check(req.path.find('\0') == std::string::npos);
  Check(idemsaga::common::http::detail::IsValidUtf8(req.path));
  for (const auto& [key, value] : req.params) {
    Check(key.find('\0') == std::string::npos && value.find('\0') == std::string::npos);
    Check(idemsaga::common::http::detail::IsValidUtf8(key) &&
          idemsaga::common::http::detail::IsValidUtf8(value));
  }
  Check(req.body.size() <= idemsaga::common::http::BodyLimitFor(limits, req.path));
  Check(req.headers.size() <= limits.max_header_fields);
  Check(!req.method.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Limits& limits = FuzzLimits();
  // The first byte picks the read size: 1..64 bytes per read, or all at once.
  size_t chunk = data[0] == 0 ? size : 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::string buffer;  // what the connection has received and not yet consumed
  auto parser = std::make_unique<RequestParser>(limits);
  size_t offered = 0;
  for (;;) {
    size_t used = 0;
    auto progress = parser->Feed(buffer, used);
    Check(used <= buffer.size());
    buffer.erase(0, used);
    switch (progress) {
      case RequestParser::Progress::kHeaderDone:
        continue;
      case RequestParser::Progress::kDone:
        CheckRequest(*parser, limits);
        parser = std::make_unique<RequestParser>(limits);  // the next pipelined request
        continue;
      case RequestParser::Progress::kRefused: {
        int status = parser->refusal().status;
        Check(status >= 400 && status < 500);
        return 0;  // the server answers and closes
      }
      case RequestParser::Progress::kNeedMore:
        // The server's buffer holds at most the header limit plus one read.
        Check(buffer.size() <= limits.max_header_bytes);
        break;
    }
    if (offered == input.size()) break;
    size_t n = std::min(chunk, input.size() - offered);
    buffer.append(input.substr(offered, n));
    offered += n;
  }
  if (parser->FeedEof() == RequestParser::Progress::kRefused) {
    Check(parser->refusal().status == 400);
  }
  return 0;
}
