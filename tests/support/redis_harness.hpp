// A private redis-server for a test: a free loopback port, a temporary directory, an
// append-only file, started as a child process of this one and stopped by its PID.
//
// Restart() starts it again on the same directory, so a test can check what survives a
// stop (SIGTERM: Redis flushes its AOF) or a crash (Kill(): SIGKILL, nothing flushed beyond
// what appendfsync already wrote). Runs as any user, root included; the server dies with the
// test process (PR_SET_PDEATHSIG). Not thread-safe: one test thread drives it.
//   test_support::RedisServer redis({.appendfsync = "always"});
//   idemsaga::common::redis::Pool pool({.url = redis.Url()}); ... redis.Kill(); redis.Restart();
#pragma once

#include <sys/types.h>

#include <string>

namespace test_support {

class RedisServer {
 public:
  struct Options {
    std::string appendfsync = "always";  // or "everysec"
  };

  RedisServer();  // appendfsync always
  explicit RedisServer(Options options);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // redis://127.0.0.1:<port>
  std::string Url() const;
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  bool running() const { return pid_ > 0; }

  // SIGTERM, then SIGKILL after 10 s; waits for the process to end.
  void Stop();
  // SIGKILL: as a crash of the server would.
  void Kill();
  // Starts it again on the same port and directory; returns once it answers PING (its AOF
  // loaded). Throws std::runtime_error, with the server's log, when it does not.
  void Restart();

 private:
  void Start();
  void Wait();

  Options options_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace test_support
