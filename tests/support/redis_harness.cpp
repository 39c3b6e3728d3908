#include "tests/support/redis_harness.hpp"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/net.hpp"
#include "tests/support/spawn.hpp"

namespace test_support {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// True once the server answers PING with PONG (not -LOADING while it reads its AOF).
bool Pongs(int port) {
  timeval tv{0, 200000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr) return false;
  bool ok = false;
  if (c->err == 0) {
    redisSetTimeout(c, tv);
    auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
    ok = r != nullptr && r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG";
    if (r != nullptr) freeReplyObject(r);
  }
  redisFree(c);
  return ok;
}

}  // namespace

RedisServer::RedisServer() : RedisServer(Options{}) {}

RedisServer::RedisServer(Options options) : options_(std::move(options)) {
  auto base = std::filesystem::temp_directory_path() / "idemsaga-redis-XXXXXX";
  std::string tmpl = base.string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  port_ = idemsaga::common::FreeLoopbackPort();
  Start();
}

RedisServer::~RedisServer() {
  Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string RedisServer::Url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

void RedisServer::Start() {
  const std::string log = dir_ + "/redis.log";
  std::vector<std::string> args = {"redis-server",
                                   "--bind",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(port_),
                                   "--dir",
                                   dir_,
                                   "--appendonly",
                                   "yes",
                                   "--appendfsync",
                                   options_.appendfsync,
                                   "--save",
                                   "",
                                   "--logfile",
                                   log,
                                   "--daemonize",
                                   "no",
                                   "--protected-mode",
                                   "yes"};
  pid_ = test_support::SpawnTiedChild(std::move(args));
  Wait();
}

void RedisServer::Wait() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("redis-server exited at start (is it installed?): " +
                               ReadFile(dir_ + "/redis.log"));
    }
    if (Pongs(port_)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Kill();
  throw std::runtime_error("redis-server did not answer within 20 s: " +
                           ReadFile(dir_ + "/redis.log"));
}

void RedisServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 1000; ++i) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill();
}

void RedisServer::Kill() { KillTiedChild(pid_); }

void RedisServer::Restart() {
  Stop();
  Start();
}

}  // namespace test_support
