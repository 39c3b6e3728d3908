// The server's routes: the table (first registered wins, as with httplib), the path patterns
// (std::regex against the whole route path), and what a path no route takes is answered (404,
// or 405 with Allow). Internal to common/http (server.hpp is the public face and says what
// the route path is). Thread-safe: a route may be added while serving.
#pragma once

#include <httplib.h>

#include <deque>
#include <regex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/http/server.hpp"

namespace idemsaga::common::http::detail {

struct Route {
  std::string method;
  std::string pattern;
  std::regex regex;
  Server::EarlyHandler handler;
  Server::FastHandler fast;  // empty for most
};

class Router {
 public:
  // Throws std::regex_error on a bad pattern.
  void Add(std::string method, const std::string& pattern, Server::EarlyHandler handler,
           Server::FastHandler fast = {});

  // Decodes `req.target`'s path into `route_path` (what routes match) and returns the first
  // route of `req`'s method (GET's for HEAD) that matches it whole, with `req.matches` filled.
  // Otherwise nullptr, with `res` the 404, the 405 (with Allow), or a 500 for a pattern that
  // cannot run. The route stays valid: routes are never removed.
  const Route* Find(httplib::Request& req, bool head, std::string& route_path,
                    httplib::Response& res) const;

  std::vector<Server::RouteInfo> Infos() const;

 private:
  // A deque keeps a found Route valid while routes are added.
  std::deque<Route> routes_;
  mutable std::shared_mutex mutex_;
};

}  // namespace idemsaga::common::http::detail
