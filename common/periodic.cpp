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
  stopping_.notify_all();  // a Drain resting between batches
  if (!running.joinable()) return;
  // Join outside the lock: a Start() racing with us must not wait for a run of fn_ to end.
  boost::asio::post(io_, [this] {
    timer_.cancel();
    io_.stop();
  });
  running.join();
}

long long Periodic::Drain(const std::function<long long()>& batch, long long size, double rest) {
  long long total = 0;
  for (;;) {
    auto began = std::chrono::steady_clock::now();
    long long n = batch();
    total += n;
    if (n < size) return total;
    auto took = std::chrono::steady_clock::now() - began;
    auto pause = std::min<std::chrono::steady_clock::duration>(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(took * rest),
        std::chrono::seconds(1));
    if (!Rest(pause)) return total;
  }
}

bool Periodic::Rest(std::chrono::steady_clock::duration d) {
  std::unique_lock lock(mutex_);
  return !stopping_.wait_for(lock, d, [this] { return stopped_; });
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
