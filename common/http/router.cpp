#include "common/http/router.hpp"

#include "common/http/request_parser.hpp"
#include "common/http/wire.hpp"
#include "common/log.hpp"

namespace idemsaga::common::http {

namespace detail {

void Router::Add(std::string method, const std::string& pattern, Server::EarlyHandler handler,
                 Server::FastHandler fast) {
  std::regex regex(pattern);  // throws std::regex_error on a bad pattern, before the lock
  std::unique_lock lock(mutex_);
  routes_.push_back(
      {std::move(method), pattern, std::move(regex), std::move(handler), std::move(fast)});
}

std::vector<Server::RouteInfo> Router::Infos() const {
  std::shared_lock lock(mutex_);
  std::vector<Server::RouteInfo> out;
  for (const auto& r : routes_) out.push_back({r.method, r.pattern});
  return out;
}

const Route* Router::Find(httplib::Request& req, bool head, std::string& route_path,
                          httplib::Response& res) const {
  // The parser has validated the target's escapes: this cannot fail.
  std::string_view target = req.target;
  PercentDecode(target.substr(0, target.find('?')), false, route_path, "/%");
  const std::string& method = head ? std::string("GET") : req.method;
  std::shared_lock lock(mutex_);
  try {
    for (const auto& route : routes_) {
      if (route.method == method && std::regex_match(route_path, req.matches, route.regex)) {
        return &route;
      }
    }
    std::string allow;
    std::smatch ignored;
    for (const auto& route : routes_) {
      if (allow.find(route.method) == std::string::npos &&
          std::regex_match(route_path, ignored, route.regex)) {
        if (!allow.empty()) allow += ", ";
        allow += route.method == "GET" ? "GET, HEAD" : route.method;
      }
    }
    if (allow.empty()) {
      SetError(res, 404, "not_found", "no such resource");
    } else {
      SetError(res, 405, "method_not_allowed", "method not allowed on this resource");
      res.set_header("Allow", allow);
    }
  } catch (const std::exception& e) {  // std::regex_error: a bug in a route's pattern
    Log("http_route_exception", {{"path", req.path}, {"error", e.what()}});
    res = ErrorResponse(500, "internal_error", "internal error");
  }
  return nullptr;
}

}  // namespace detail

std::string DecodeCapture(std::string_view capture) {
  // The route path holds no escape but %2F and %25 (Router::Find): a plain decode is exact.
  std::string out;
  detail::PercentDecode(capture, false, out);
  return out;
}

}  // namespace idemsaga::common::http
