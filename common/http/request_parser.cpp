#include "common/http/request_parser.hpp"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <cctype>
#include <limits>

namespace idemsaga::common::http {
namespace {

namespace bhttp = boost::beast::http;
using detail::IEquals;

std::string_view View(boost::beast::string_view s) { return {s.data(), s.size()}; }

// A decoded path or query component a route may see: no NUL (C APIs and PostgreSQL would cut
// or refuse the key there) and valid UTF-8 (PostgreSQL refuses it, which used to surface as a
// 503 "database unavailable").
bool Acceptable(std::string_view decoded) {
  return decoded.find('\0') == std::string_view::npos && detail::IsValidUtf8(decoded);
}

// obs-fold (a field line continued on the next line) in the raw header bytes. Beast joins
// folded lines with a space, which would hand the handler bytes the client never sent;
// RFC 9112 §5.2 lets a server refuse it with 400 instead.
bool HasObsFold(std::string_view raw) {
  for (size_t at = raw.find('\n'); at != std::string_view::npos; at = raw.find('\n', at + 1)) {
    if (at + 1 < raw.size() && (raw[at + 1] == ' ' || raw[at + 1] == '\t')) return true;
  }
  return false;
}

}  // namespace

namespace detail {

bool PercentDecode(std::string_view in, bool plus_is_space, std::string& out,
                   std::string_view keep_encoded) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out.clear();
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (in.size() - i < 3) return false;  // needs two hex digits
      int hi = hex(in[i + 1]);
      int lo = hex(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      char decoded = static_cast<char>(hi * 16 + lo);
      if (keep_encoded.find(decoded) == std::string_view::npos) {
        out.push_back(decoded);
      } else {
        static constexpr char kHex[] = "0123456789ABCDEF";
        out.push_back('%');
        out.push_back(kHex[hi]);
        out.push_back(kHex[lo]);
      }
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return true;
}

bool IsValidUtf8(std::string_view s) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < s.size();) {
    unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // beyond U+10FFFF
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;  // truncated sequence
    if (byte(i + 1) < lo || byte(i + 1) > hi) return false;
    for (size_t k = 2; k <= n; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace detail

size_t BodyLimitFor(const Limits& limits, std::string_view path) {
  auto it = limits.large_bodies.find(std::string(path));
  return it == limits.large_bodies.end() ? limits.max_body_bytes : it->second;
}

RequestParser::RequestParser(const Limits& limits) : limits_(limits) {
  // Our own checks are the limits (cumulative header bytes, per-path bodies); Beast's are set
  // so that they never fire first. An unset body limit would not do: 1.74 compares a length
  // with an empty optional as "greater".
  header_limit(static_cast<std::uint32_t>(
      std::min<size_t>(limits_.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
  body_limit(std::numeric_limits<std::uint64_t>::max());
}

RequestParser::Progress RequestParser::Feed(std::string_view data, size_t& consumed) {
  consumed = 0;
  if (refusal_.status != 0) return Progress::kRefused;
  for (;;) {
    if (is_done()) return Progress::kDone;
    std::string_view rest = data.substr(consumed);
    if (rest.empty()) return Progress::kNeedMore;
    bool header_before = is_header_done();
    boost::beast::error_code ec;
    size_t used = put(boost::asio::const_buffer(rest.data(), rest.size()), ec);
    consumed += used;
    if (refusal_.status != 0) return Progress::kRefused;  // set by a callback
    if (!header_before) {
      header_bytes_ += used;
      if (HasObsFold(rest.substr(0, used))) {
        return Refuse(400, "bad_request", "obsolete line folding in a header field");
      }
    }
    if (ec == bhttp::error::need_more) {
      size_t pending = data.size() - consumed;
      if (!is_header_done() && header_bytes_ + pending > limits_.max_header_bytes) {
        return RefuseFor(bhttp::error::header_limit);
      }
      // A chunk-size line or trailer section that never ends.
      if (is_header_done() && pending >= limits_.max_header_bytes) {
        return Refuse(400, "bad_request", "a chunk header or trailer section is too long");
      }
      return Progress::kNeedMore;
    }
    if (ec) return RefuseFor(ec);
    if (!header_before && is_header_done()) {
      if (header_bytes_ > limits_.max_header_bytes) return RefuseFor(bhttp::error::header_limit);
      return Progress::kHeaderDone;
    }
    if (used == 0) return Progress::kNeedMore;  // no progress: wait for bytes
  }
}

RequestParser::Progress RequestParser::FeedEof() {
  if (!got_some() || is_done()) return Progress::kNeedMore;
  return Refuse(400, "bad_request", "the connection ended in the middle of the request");
}

RequestParser::Progress RequestParser::Refuse(int status, std::string code, std::string message) {
  if (refusal_.status == 0) refusal_ = {status, std::move(code), std::move(message)};
  return Progress::kRefused;
}

void RequestParser::RefuseFromCallback(boost::beast::error_code& ec, int status, std::string code,
                                       std::string message) {
  Refuse(status, std::move(code), std::move(message));
  ec = bhttp::error::bad_value;  // stops Beast; refusal_ says why
}

RequestParser::Progress RequestParser::RefuseFor(const boost::beast::error_code& ec) {
  using E = bhttp::error;
  if (ec == E::header_limit || ec == E::buffer_overflow) {
    if (!got_request_line_) return Refuse(414, "uri_too_long", "the request line is too long");
    return Refuse(
        431, "request_header_fields_too_large",
        "the header is larger than " + std::to_string(limits_.max_header_bytes) + " bytes");
  }
  if (ec == E::body_limit) {
    return Refuse(413, "payload_too_large",
                  "the body is larger than " + std::to_string(body_limit_) + " bytes");
  }
  if (ec == E::bad_content_length) {
    return Refuse(400, "bad_request", "invalid Content-Length (or with Transfer-Encoding)");
  }
  if (ec == E::bad_transfer_encoding) {
    return Refuse(400, "bad_request", "invalid Transfer-Encoding (or with Content-Length)");
  }
  if (ec == E::bad_chunk || ec == E::bad_chunk_extension) {
    return Refuse(400, "bad_request", "malformed chunked body");
  }
  if (ec == E::bad_method || ec == E::bad_target || ec == E::bad_version ||
      (ec == E::bad_line_ending && !got_request_line_)) {
    return Refuse(400, "bad_request", "malformed request line");
  }
  if (ec == E::bad_field || ec == E::bad_value || ec == E::bad_line_ending ||
      ec == E::bad_obs_fold) {
    return Refuse(400, "bad_request", "malformed header field");
  }
  return Refuse(400, "bad_request", "the request could not be parsed");
}

bool RequestParser::SetTarget(std::string_view target) {
  req_.target = std::string(target);
  // origin-form only: we are no proxy (absolute-form, authority-form and `*` are refused).
  if (target.empty() || target.front() != '/') return false;
  for (unsigned char c : target) {
    if (c >= 0x80) return false;  // RFC 3986: other bytes travel percent-encoded
  }
  auto question = target.find('?');
  if (!detail::PercentDecode(target.substr(0, question), false, req_.path)) return false;
  if (!Acceptable(req_.path)) return false;
  if (question == std::string_view::npos) return true;
  std::string_view query = target.substr(question + 1);
  std::string key, value;
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    if (!detail::PercentDecode(pair.substr(0, eq), true, key)) return false;
    value.clear();
    if (eq != std::string_view::npos && !detail::PercentDecode(pair.substr(eq + 1), true, value)) {
      return false;
    }
    if (!Acceptable(key) || !Acceptable(value)) return false;
    req_.params.emplace(key, value);
  }
  return true;
}

void RequestParser::on_request_impl(bhttp::verb, boost::beast::string_view method_str,
                                    boost::beast::string_view target, int version,
                                    boost::beast::error_code& ec) {
  got_request_line_ = true;
  if (target.size() > limits_.max_target_bytes) {
    return RefuseFromCallback(
        ec, 414, "uri_too_long",
        "the request target is longer than " + std::to_string(limits_.max_target_bytes) + " bytes");
  }
  req_.method = std::string(View(method_str));
  req_.version = version == 10 ? "HTTP/1.0" : "HTTP/1.1";
  if (!SetTarget(View(target))) {
    return RefuseFromCallback(
        ec, 400, "bad_request",
        "the request target must be a path with valid %-escapes, without NUL, of UTF-8");
  }
}

void RequestParser::on_response_impl(int, boost::beast::string_view, int,
                                     boost::beast::error_code& ec) {
  ec = bhttp::error::bad_method;  // a request parser never parses a status line
}

void RequestParser::on_field_impl(bhttp::field, boost::beast::string_view name,
                                  boost::beast::string_view value, boost::beast::error_code& ec) {
  if (is_header_done()) return;  // a trailer of a chunked body: nothing reads them
  if (++fields_ > limits_.max_header_fields) {
    return RefuseFromCallback(
        ec, 431, "request_header_fields_too_large",
        "more than " + std::to_string(limits_.max_header_fields) + " header fields");
  }
  req_.headers.emplace(std::string(View(name)), std::string(View(value)));
}

void RequestParser::on_header_impl(boost::beast::error_code& ec) {
  // Beast refuses Content-Length with `chunked` and a second `chunked`, but takes another
  // coding (`gzip`) as no body at all: the rest would be read as the next request (smuggling).
  // RFC 9112 §6.3: 400 unless `chunked` is the one and final coding.
  if (auto n = req_.get_header_value_count("Transfer-Encoding"); n > 0) {
    if (n > 1 || !IEquals(req_.get_header_value("Transfer-Encoding"), "chunked") ||
        req_.version == "HTTP/1.0") {
      return RefuseFromCallback(ec, 400, "bad_request",
                                "Transfer-Encoding must be `chunked` alone, in HTTP/1.1");
    }
  }
  // Refused before the body is read: nothing is inflated or buffered for it.
  for (size_t i = 0, n = req_.get_header_value_count("Content-Encoding"); i < n; ++i) {
    if (!IEquals(req_.get_header_value("Content-Encoding", i), "identity")) {
      return RefuseFromCallback(ec, 415, "unsupported_content_encoding",
                                "Content-Encoding is not supported; send the body uncompressed");
    }
  }
  body_limit_ = BodyLimitFor(limits_, req_.path);
  if (auto length = content_length(); length && *length > body_limit_) {
    return RefuseFromCallback(ec, 413, "payload_too_large",
                              "the body is larger than " + std::to_string(body_limit_) + " bytes");
  }
  expects_continue_ = IEquals(req_.get_header_value("Expect"), "100-continue");
}

void RequestParser::on_body_init_impl(const boost::optional<std::uint64_t>& content_length,
                                      boost::beast::error_code&) {
  if (content_length) req_.body.reserve(*content_length);  // <= body_limit_, checked above
}

size_t RequestParser::on_body_impl(boost::beast::string_view body, boost::beast::error_code& ec) {
  if (body.size() > body_limit_ - req_.body.size()) {
    ec = bhttp::error::body_limit;
    return 0;
  }
  req_.body.append(body.data(), body.size());
  return body.size();
}

void RequestParser::on_chunk_header_impl(std::uint64_t size, boost::beast::string_view,
                                         boost::beast::error_code& ec) {
  if (size > body_limit_ - req_.body.size()) ec = bhttp::error::body_limit;
}

size_t RequestParser::on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                                         boost::beast::error_code& ec) {
  return on_body_impl(body, ec);
}

void RequestParser::on_finish_impl(boost::beast::error_code&) {}

}  // namespace idemsaga::common::http
