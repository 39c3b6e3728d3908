#include "common/http/server.hpp"

#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "common/pg/pool.hpp"

namespace common::http {
namespace {

// httplib's ThreadPool queues without bound; this one blocks the accept thread instead, so
// overload waits in the kernel backlog (bounded, visible) rather than in our memory.
class BoundedThreadPool : public httplib::TaskQueue {
 public:
  BoundedThreadPool(size_t threads, size_t capacity) : capacity_(capacity) {
    for (size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return jobs_.size() < capacity_ || shutdown_; });
    jobs_.push_back(std::move(fn));
    not_empty_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mutex_);
      shutdown_ = true;
    }
    not_empty_.notify_all();
    not_full_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mutex_);
        not_empty_.wait(lock, [&] { return !jobs_.empty() || shutdown_; });
        if (jobs_.empty()) return;  // shut down and drained
        fn = std::move(jobs_.front());
        jobs_.pop_front();
        not_full_.notify_one();
      }
      fn();
    }
  }

  const size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  bool shutdown_ = false;
};

struct StatusText {
  std::string_view code;
  std::string_view message;
};

// What httplib's own refusals mean, in our error shape (its .so exports no status texts).
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
    case 413:
      return {"payload_too_large", "the body is too large"};
    case 414:
      return {"uri_too_long", "the request URI is too long"};
    case 415:
      return {"unsupported_media_type", "unsupported media type"};
    case 503:
      return {"unavailable", "temporarily unavailable; retry later"};
    default:
      if (status >= 500) return {"internal_error", "internal error"};
      return {"bad_request", "the request was refused"};
  }
}

}  // namespace

Server::Server(Limits limits) : limits_(std::move(limits)) {
  size_t largest = limits_.max_body_bytes;
  for (const auto& [path, bytes] : limits_.large_bodies) largest = std::max(largest, bytes);
  set_payload_max_length(largest);  // per-route limits are checked below and at parse
  set_read_timeout(limits_.read_timeout_s);
  set_write_timeout(limits_.write_timeout_s);
  set_keep_alive_max_count(limits_.keep_alive_max_count);
  set_keep_alive_timeout(limits_.keep_alive_timeout_s);
  set_tcp_nodelay(true);
  new_task_queue = [this] { return new BoundedThreadPool(limits_.threads, limits_.queue); };

  // Runs before the body is read: refuse what we will not read, so nothing is inflated or
  // buffered for it. Debian's build inflates gzip bodies without a bound.
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    auto encoding = req.get_header_value("Content-Encoding");
    if (!encoding.empty() && encoding != "identity") {
      SetError(res, 415, "unsupported_content_encoding",
               "Content-Encoding is not supported; send the body uncompressed");
      res.set_header("Connection", "close");
      return HandlerResponse::Handled;
    }
    if (req.has_header("Content-Length")) {
      auto declared = req.get_header_value("Content-Length");
      bool digits = !declared.empty() && declared.size() <= 12 &&
                    declared.find_first_not_of("0123456789") == std::string::npos;
      size_t limit = BodyLimit(req.path);
      if (!digits || std::stoull(declared) > limit) {
        SetError(res, 413, "payload_too_large",
                 "the body is larger than " + std::to_string(limit) + " bytes");
        res.set_header("Connection", "close");
        return HandlerResponse::Handled;
      }
    }
    return HandlerResponse::Unhandled;
  });

  // Every 4xx/5xx that httplib makes itself (404, 413, ...) gets the same JSON shape.
  set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      auto text = TextFor(res.status);
      SetError(res, res.status, text.code, text.message);
    }
  });

  // The one catch point for a handler's exception. The database being down, restarting or
  // unsure whether a commit landed is an outage (503, retry with the same key); anything
  // else is a bug (500). Neither is ever the client's fault.
  set_exception_handler([](const httplib::Request& req, httplib::Response& res,
                           std::exception_ptr ep) {
    std::string what = "unknown";
    bool outage = false;
    try {
      std::rethrow_exception(std::move(ep));
    } catch (const pg::PoolUnavailable& e) {
      what = e.what();
      outage = true;
    } catch (const pqxx::failure& e) {  // broken_connection, in_doubt_error, sql_error...
      what = e.what();
      outage = true;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Log(outage ? "handler_database_unavailable" : "handler_exception",
        {{"method", req.method}, {"path", req.path}, {"error", what}});
    if (outage) {
      SetUnavailable(res, "the database is unavailable");
    } else {
      SetError(res, 500, "internal_error", "internal error; retrying with the same key is safe");
    }
  });
}

bool Server::Serve() {
  serving_ = true;
  bool ok = stop_requested_ || listen_after_bind();
  serving_ = false;
  return ok;
}

void Server::Stop() {
  stop_requested_ = true;
  while (serving_) {
    stop();  // a no-op until the listen loop runs; then it ends it
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

size_t Server::BodyLimit(const std::string& path) const {
  auto it = limits_.large_bodies.find(path);
  return it == limits_.large_bodies.end() ? limits_.max_body_bytes : it->second;
}

int Server::Bind(const std::string& host, int port) {
  int bound = port;
  if (port == 0) {
    bound = bind_to_any_port(host);
    if (bound < 0) return -1;
  } else if (!bind_to_port(host, port)) {
    return -1;
  }
  // The .so listens with a backlog of 5; listening again on the same socket only raises it.
  ::listen(svr_sock_, limits_.backlog);
  return bound;
}

std::string ErrorBody(std::string_view code, std::string_view message) {
  nlohmann::json body = {{"error", {{"code", code}, {"message", message}}}};
  return body.dump();
}

void SetError(httplib::Response& res, int status, std::string_view code, std::string_view message) {
  res.status = status;
  res.set_content(ErrorBody(code, message), "application/json");
}

std::optional<nlohmann::json> ParseJsonBody(const httplib::Request& req, httplib::Response& res,
                                            const Limits& limits) {
  auto type = req.get_header_value("Content-Type");
  auto semicolon = type.find(';');
  std::string media = type.substr(0, semicolon);
  while (!media.empty() && media.back() == ' ') media.pop_back();
  for (auto& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (media != "application/json") {
    SetError(res, 415, "unsupported_media_type", "Content-Type must be application/json");
    return std::nullopt;
  }
  size_t limit = limits.max_body_bytes;
  if (auto it = limits.large_bodies.find(req.path); it != limits.large_bodies.end()) {
    limit = it->second;
  }
  if (req.body.size() > limit) {
    SetError(res, 413, "payload_too_large",
             "the body is larger than " + std::to_string(limit) + " bytes");
    return std::nullopt;
  }
  bool too_deep = false;
  auto depth_guard = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > limits.max_json_depth) too_deep = true;
    return !too_deep;
  };
  try {
    // A callback that refuses an element discards it rather than throwing; hence the flag.
    auto body = nlohmann::json::parse(req.body, depth_guard);
    if (!too_deep) return body;
    SetError(res, 400, "invalid_json",
             "the JSON body nests deeper than " + std::to_string(limits.max_json_depth));
  } catch (const nlohmann::json::exception&) {
    SetError(res, 400, "invalid_json", "the body is not valid JSON");
  }
  return std::nullopt;
}

void SetUnavailable(httplib::Response& res, const std::string& what) {
  SetError(res, 503, "unavailable", what + "; retrying with the same key is safe");
  res.set_header("Retry-After", "1");
}

void AddHealthRoutes(Server& server, pg::Pool& pool) {
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  server.Get("/readyz", [&pool](const httplib::Request&, httplib::Response& res) {
    try {
      pool.With([](pqxx::connection& conn) {
        pqxx::nontransaction tx(conn);
        tx.exec("SELECT 1");
      });
      res.set_content(R"({"status":"ready"})", "application/json");
    } catch (const std::exception&) {
      SetUnavailable(res, "the database is not reachable");
    }
  });
}

std::string BearerToken(const httplib::Request& req) {
  auto value = req.get_header_value("Authorization");
  constexpr std::string_view kPrefix = "Bearer ";
  if (value.size() <= kPrefix.size() || value.compare(0, kPrefix.size(), kPrefix) != 0) return "";
  return value.substr(kPrefix.size());
}

std::pair<std::string, int> SplitHostPort(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw std::invalid_argument("expected HOST:PORT, got '" + listen + "'");
  }
  int port = std::stoi(listen.substr(colon + 1));
  if (port < 0 || port > 65535) throw std::invalid_argument("port out of range: " + listen);
  return {listen.substr(0, colon), port};
}

}  // namespace common::http
