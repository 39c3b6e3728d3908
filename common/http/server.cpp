#include "common/http/server.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <thread>
#include <vector>

#include "common/http/connection.hpp"
#include "common/http/exception_policy.hpp"
#include "common/http/server_core.hpp"
#include "common/http/wire.hpp"
#include "common/log.hpp"

namespace idemsaga::common::http {

namespace asio = boost::asio;

namespace detail {

int ServerCore::Bind(const std::string& host, int port) {
  error_code ec;
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, std::to_string(port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) return -1;
  for (const auto& entry : results) {
    auto endpoint = entry.endpoint();
    acceptor.open(endpoint.protocol(), ec);
    if (ec) continue;
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(limits.backlog, ec);
    if (!ec) {
      auto bound = acceptor.local_endpoint(ec);
      if (!ec) return bound.port();
    }
    error_code ignored;
    acceptor.close(ignored);
  }
  return -1;
}

bool ServerCore::Serve() {
  {
    std::lock_guard lock(serve_mutex);
    if (stop_requested) return true;
    if (!acceptor.is_open()) return false;
    serving = true;
  }
  work.emplace(ioc.get_executor());
  pool.Start(this);
  asio::post(accept_strand, [this] { Accept(); });
  std::vector<std::thread> loops;
  for (size_t i = 1; i < limits.io_threads; ++i) loops.emplace_back([this] { RunLoop(); });
  RunLoop();
  for (auto& t : loops) t.join();
  pool.Finish();  // idle by now: every queued job holds a connection, and none is left
  {
    std::lock_guard lock(serve_mutex);
    serving = false;
  }
  serve_cv.notify_all();
  return true;
}

void ServerCore::RunLoop() {
  for (;;) {
    try {
      ioc.run();
      return;
    } catch (const std::exception& e) {  // a bug in a completion handler; keep serving
      Log("http_loop_exception", {{"error", e.what()}});
    }
  }
}

void ServerCore::Stop() {
  if (!stop_requested.exchange(true)) asio::post(accept_strand, [this] { BeginStop(); });
  if (WorkerPool::OnWorkerOf(this)) return;
  std::unique_lock lock(serve_mutex);
  serve_cv.wait(lock, [&] { return !serving; });
}

void ServerCore::BeginStop() {
  stopping = true;
  error_code ignored;
  acceptor.close(ignored);
  accept_pause.cancel();
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard lock(registry_mutex);
    for (auto& [raw, weak] : registry) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) asio::post(c->executor(), [c] { c->OnStop(); });
  if (live == 0) ReleaseWork();
}

// With no connection left the loop has nothing more to do; run() returns once it is idle.
void ServerCore::ReleaseWork() {
  if (!work_released.exchange(true)) asio::post(accept_strand, [this] { work.reset(); });
}

void ServerCore::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [this](error_code ec, tcp::socket socket) {
    OnAccept(ec, std::move(socket));
  });
}

void ServerCore::OnAccept(error_code ec, tcp::socket socket) {
  if (stopping || ec == asio::error::operation_aborted) return;
  if (ec) {
    // Out of descriptors or memory: accepting again at once would spin. Pause; the kernel
    // backlog holds the clients meanwhile.
    int e = ec.value();
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
      Log("http_accept_paused", {{"error", ec.message()}});
      accept_pause.expires_after(std::chrono::milliseconds(100));
      accept_pause.async_wait([this](error_code wait) {
        if (!wait && !stopping) Accept();
      });
      return;
    }
    return Accept();  // the client gave up before we accepted it
  }
  if (live >= limits.max_connections) {
    // Over the cap: a best-effort 503 (the socket buffer takes it without blocking), closed.
    static const std::string kBusy = Serialize(
        ErrorResponse(503, "unavailable", "too many connections; retry later"), false, false);
    error_code ignored;
    socket.non_blocking(true, ignored);
    asio::write(socket, asio::buffer(kBusy), ignored);
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    return Accept();
  }
  error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto connection = std::make_shared<Connection>(*this, std::move(socket));
  Register(connection);
  asio::dispatch(connection->executor(), [connection] { connection->Start(); });
  Accept();
}

void ServerCore::Register(const std::shared_ptr<Connection>& c) {
  std::lock_guard lock(registry_mutex);
  registry.emplace(c.get(), c);
}

void ServerCore::Unregister(Connection* c) {
  std::lock_guard lock(registry_mutex);
  registry.erase(c);
}

bool ServerCore::FindRoute(Exchange& ex) const {
  ex.route = router.Find(ex.req, ex.head, ex.route_path, ex.res);
  return ex.route != nullptr;
}

bool ServerCore::RunFast(Exchange& ex) const {
  if (!ex.route->fast) return false;
  bool answered = false;
  try {
    answered = ex.route->fast(ex.req, ex.res);
  } catch (...) {  // the worker's handler answers it, exceptions included
  }
  if (!answered) {
    ex.res = httplib::Response();
    return false;
  }
  Complete(ex.req, ex.res);
  return true;
}

void ServerCore::Run(Exchange& ex, const EarlyAnswer& early) const {
  try {
    ex.route->handler(ex.req, ex.res, early);
  } catch (...) {
    AnswerException(ex.req, ex.res, std::current_exception(), classify);
  }
  Complete(ex.req, ex.res);
}

}  // namespace detail

Server::Server(Limits limits, FailureClassifier classify)
    : impl_(std::make_unique<detail::ServerCore>(
          std::move(limits), classify ? std::move(classify) : FailureClassifier(ClassifyPlain))) {}

Server::~Server() { Stop(); }

std::vector<Server::RouteInfo> Server::Routes() const { return impl_->router.Infos(); }

namespace {

// A handler with no use for its request's EarlyAnswer.
Server::EarlyHandler Plain(Server::Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                        const EarlyAnswer&) { handler(req, res); };
}

}  // namespace

Server& Server::Get(const std::string& pattern, Handler handler) {
  return Get(pattern, Plain(std::move(handler)));
}
Server& Server::Post(const std::string& pattern, Handler handler) {
  return Post(pattern, Plain(std::move(handler)));
}
Server& Server::Put(const std::string& pattern, Handler handler) {
  impl_->router.Add("PUT", pattern, Plain(std::move(handler)));
  return *this;
}
Server& Server::Get(const std::string& pattern, EarlyHandler handler) {
  impl_->router.Add("GET", pattern, std::move(handler));
  return *this;
}
Server& Server::Post(const std::string& pattern, EarlyHandler handler) {
  impl_->router.Add("POST", pattern, std::move(handler));
  return *this;
}
Server& Server::Post(const std::string& pattern, EarlyHandler handler, FastHandler fast) {
  impl_->router.Add("POST", pattern, std::move(handler), std::move(fast));
  return *this;
}

const Limits& Server::limits() const { return impl_->limits; }

int Server::Bind(const std::string& host, int port) { return impl_->Bind(host, port); }

bool Server::Serve() { return impl_->Serve(); }

void Server::Stop() { impl_->Stop(); }

}  // namespace idemsaga::common::http
