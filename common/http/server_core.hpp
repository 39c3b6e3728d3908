// Everything behind common::http::Server: the event loop and its acceptor, the workers, the
// routes, the open connections, and the exception policy the server was built with. Internal
// to common/http (server.hpp is the public face).
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/failure.hpp"
#include "common/http/router.hpp"
#include "common/http/server.hpp"
#include "common/http/worker_pool.hpp"

namespace idemsaga::common::http::detail {

class Connection;
struct Exchange;

// The loop's state is touched on the loop only (the acceptor's strand, each connection's
// strand); `stopping`, `live` and the registry are shared.
class ServerCore {
 public:
  using error_code = boost::system::error_code;
  using tcp = boost::asio::ip::tcp;

  ServerCore(Limits l, FailureClassifier c)
      : limits(std::move(l)), classify(std::move(c)), pool(limits.threads, limits.queue) {}

  int Bind(const std::string& host, int port);
  bool Serve();
  void Stop();

  void Accept();
  void OnAccept(error_code ec, tcp::socket socket);
  void BeginStop();
  void ReleaseWork();
  void Register(const std::shared_ptr<Connection>& c);
  void Unregister(Connection* c);
  // Finds the route (true) or fills the 404/405 answer (false).
  bool FindRoute(Exchange& ex) const;
  // On a worker: the handler (given `early`, its request's), its exception, the defaults.
  void Run(Exchange& ex, const EarlyAnswer& early) const;
  // The route's fast handler, on the loop: true when it answered ex.res.
  bool RunFast(Exchange& ex) const;
  void RunLoop();

  const Limits limits;
  // What a handler's exception means (the exception policy answers by it).
  const FailureClassifier classify;
  Router router;
  boost::asio::io_context ioc;
  boost::asio::strand<boost::asio::io_context::executor_type> accept_strand{ioc.get_executor()};
  tcp::acceptor acceptor{accept_strand};
  boost::asio::steady_timer accept_pause{accept_strand};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::atomic<bool> work_released{false};
  WorkerPool pool;
  std::atomic<size_t> live{0};
  std::atomic<bool> stopping{false};
  std::atomic<bool> stop_requested{false};
  std::mutex registry_mutex;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> registry;
  std::mutex serve_mutex;
  std::condition_variable serve_cv;
  bool serving = false;
};

}  // namespace idemsaga::common::http::detail
