// A real idemsaga::common::http::Server on 127.0.0.1 (a free port) with the routes the edge tests
// aim at: echo (what the handler saw, bytes hex-encoded so nothing is lost in JSON), sleep, work,
// block (until released), drop, throw. Serves on its own thread until destroyed.
//
// Thread-safety: handlers run on the server's workers; Release() from any thread.
//   edge::EdgeServer s({.threads = 4}); edge::Socket c(s.port);
//   c.Send("GET /echo HTTP/1.1\r\nHost: x\r\n\r\n");
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/http/server.hpp"
#include "common/pg/errors.hpp"

namespace edge {

inline std::string Hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0xf]);
  }
  return out;
}

class EdgeServer {
 public:
  explicit EdgeServer(idemsaga::common::http::Limits limits = {})
      : server(std::move(limits), idemsaga::common::pg::Classify) {
    auto echo = [](const httplib::Request& req, httplib::Response& res) {
      nlohmann::json headers = nlohmann::json::array();
      for (const auto& [name, value] : req.headers) headers.push_back({name, Hex(value)});
      nlohmann::json params = nlohmann::json::object();
      for (const auto& [k, v] : req.params) params[Hex(k)] = Hex(v);
      nlohmann::json body = {{"method", Hex(req.method)}, {"target", Hex(req.target)},
                             {"path", Hex(req.path)},     {"headers", headers},
                             {"params", params},          {"body", Hex(req.body)}};
      res.set_content(body.dump(), "application/json");
    };
    server.Get("/echo", echo);
    server.Post("/echo", echo);
    // Registered first, as the orchestrator's is: it must never take a key that ends in "/trace".
    server.Get(R"(/v1/orders/(.+)/trace)", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(
          nlohmann::json{
              {"trace_of", Hex(idemsaga::common::http::DecodeCapture(req.matches[1].str()))}}
              .dump(),
          "application/json");
    });
    server.Get(R"(/v1/orders/(.+))", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(
          nlohmann::json{{"key", Hex(idemsaga::common::http::DecodeCapture(req.matches[1].str()))}}
              .dump(),
          "application/json");
    });
    server.Get("/sleep", [](const httplib::Request& req, httplib::Response& res) {
      int ms = req.has_param("ms") ? std::stoi(req.get_param_value("ms")) : 100;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      res.set_content(R"({"slept":true})", "application/json");
    });
    // A little CPU, like a handler that validates and serialises a small order.
    server.Get("/work", [](const httplib::Request&, httplib::Response& res) {
      unsigned long long h = 1469598103934665603ULL;
      for (int i = 0; i < 20000; ++i) h = (h ^ static_cast<unsigned>(i)) * 1099511628211ULL;
      res.set_content(nlohmann::json{{"h", h % 1000}}.dump(), "application/json");
    });
    server.Get("/block", [this](const httplib::Request&, httplib::Response& res) {
      std::unique_lock lock(mutex_);
      ++blocked_;
      released_.wait(lock, [&] { return release_; });
      res.set_content(R"({"released":true})", "application/json");
    });
    server.Get("/drop", [](const httplib::Request&, httplib::Response& res) {
      idemsaga::common::http::CloseWithoutResponse(res);
    });
    server.Get("/throw", [](const httplib::Request&, httplib::Response&) {
      throw std::runtime_error("a bug");
    });
    server.Get("/db-down", [](const httplib::Request&, httplib::Response&) {
      throw pqxx::broken_connection("the database went away");
    });
    // A route with a fast handler (run on the event loop): X-Fast says what it does, "yes"
    // answers, "no" declines and "throw" throws, both after scribbling on the response, which
    // must not leak into the worker's answer.
    server.Post(
        "/fast",
        [this](const httplib::Request&, httplib::Response& res, const auto&) {
          res.set_content(nlohmann::json{{"by", "worker"}, {"on_loop", OnLoop()}}.dump(),
                          "application/json");
        },
        [this](const httplib::Request& req, httplib::Response& res) {
          auto mode = req.get_header_value("X-Fast");
          res.status = 299;
          res.set_header("X-Scribbled", "1");
          res.set_content(nlohmann::json{{"by", "fast"}, {"on_loop", OnLoop()}}.dump(),
                          "application/json");
          if (mode == "throw") throw std::runtime_error("fast handler bug");
          if (mode == "yes") res.status = 200;
          return mode == "yes";
        });
    port = server.Bind("127.0.0.1", 0);
    if (port <= 0) throw std::runtime_error("cannot bind");
    thread_ = std::thread([this] {
      loop_id_ = std::this_thread::get_id();  // one io thread: Serve's is the event loop
      server.Serve();
    });
  }

  bool OnLoop() const { return std::this_thread::get_id() == loop_id_.load(); }

  ~EdgeServer() {
    Release();
    server.Stop();
    thread_.join();
  }

  EdgeServer(const EdgeServer&) = delete;
  EdgeServer& operator=(const EdgeServer&) = delete;

  // Lets every /block handler return.
  void Release() {
    {
      std::lock_guard lock(mutex_);
      release_ = true;
    }
    released_.notify_all();
  }

  int Blocked() {
    std::lock_guard lock(mutex_);
    return blocked_;
  }

  idemsaga::common::http::Server server;
  int port = -1;

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  bool release_ = false;
  int blocked_ = 0;
  std::atomic<std::thread::id> loop_id_;
  std::thread thread_;
};

}  // namespace edge
