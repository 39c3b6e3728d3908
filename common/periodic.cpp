#include "common/periodic.hpp"

#include <boost/asio/post.hpp>

#include "common/log.hpp"

namespace idemsaga::common {

Periodic::Periodic(std::string name, std::chrono::milliseconds interval, std::function<void()> fn)
    : name_(std::move(name)), interval_(interval), fn_(std::move(fn)), timer_(io_) {}

Periodic::~Periodic() { Stop(); }

void Periodic::Start() {
  std::lock_guard lock(mutex_);
  if (stopped_ || thread_.joinable()) return;
  Arm();
  thread_ = std::thread([this] { io_.run(); });
}

void Periodic::Stop() {
  std::thread running;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    running = std::move(thread_);
  }
  if (!running.joinable()) return;
  // Join outside the lock: a Start() racing with us must not wait for a run of fn_ to end.
  boost::asio::post(io_, [this] {
    timer_.cancel();
    io_.stop();
  });
  running.join();
}

void Periodic::Arm() {
  timer_.expires_after(interval_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // cancelled
    try {
      fn_();
    } catch (const std::exception& e) {
      Log("periodic_failed", {{"task", name_}, {"error", e.what()}});
    }
    Arm();
  });
}

}  // namespace idemsaga::common
