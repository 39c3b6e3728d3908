// A bounded pool of hiredis connections, with timeouts, for the stores kept in Redis (the
// participant guard's key store, steps/guard/redis_guard.hpp, and the demo inventory's stock).
//
// hiredis contexts are not thread-safe: Borrow hands one to one thread at a time (waiting up
// to `borrow_timeout`). A connection that saw an I/O error or a timeout is closed instead of
// returned, with every idle one (a restarted server left them all dead), and the command is
// sent once more on a fresh connection: safe because every command its users send is a
// read, an HSETNX or a guarded script, which replays rather than applies twice. So a Redis
// restart heals without a process restart and without a burst of 503s. Every command carries its
// arguments as an argv array (never a formatted string) and fails within `command_timeout`: a dead
// Redis is an Unavailable (503), never a hang. Thread-safe.
//   Pool redis({.url = "redis://127.0.0.1:6379/0"});
//   auto reply = redis.Eval(kScript, {key}, {arg});
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/unavailable.hpp"

// hiredis' connection, kept out of this header so that its includers need no hiredis headers.
struct redisContext;

namespace idemsaga::common::redis {

// Redis could not be reached, or did not answer in time: nothing is known to have happened.
// (A script runs whole or not at all, so a retry with the same key is safe.)
class Unavailable : public common::Unavailable {
  using common::Unavailable::Unavailable;
};

// An error reply (a script error, a refused command).
class Error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A reply, copied out of hiredis.
struct Reply {
  enum class Type { kNil, kInteger, kString, kStatus, kArray, kError };
  Type type = Type::kNil;
  long long integer = 0;
  std::string str;  // kString, kStatus, kError
  std::vector<Reply> elements;
};

// A Lua script, loaded once per server (SCRIPT LOAD) and run by its SHA (EVALSHA); reloaded
// when the server answers NOSCRIPT (it restarted, or its script cache was flushed).
struct Script {
  std::string source;
};

// Where the server is: redis://[:password@]host[:port][/db]. Throws std::invalid_argument.
struct Address {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string password;
};
Address ParseUrl(const std::string& url);

class Pool {
 public:
  struct Options {
    std::string url = "redis://127.0.0.1:6379";
    size_t size = 16;
    std::chrono::milliseconds connect_timeout{1000};
    // A script on a few keys takes microseconds; this bounds a stalled server or network.
    std::chrono::milliseconds command_timeout{2000};
    std::chrono::milliseconds borrow_timeout{2000};
  };

  explicit Pool(Options options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Throws Unavailable, or Error on an error reply.
  Reply Command(const std::vector<std::string>& argv);
  Reply Eval(const Script& script, const std::vector<std::string>& keys,
             const std::vector<std::string>& args);

 private:
  // A connection; `fresh` when opened for this call (not reused from the pool).
  redisContext* Borrow(bool& fresh);
  void Return(redisContext* ctx, bool broken);
  // `argv` on a pooled connection, once more on a fresh one if a reused one was dead.
  Reply Run(const std::vector<std::string>& argv);
  redisContext* Open() const;
  // One command on `ctx`; sets `broken` on an I/O error or timeout.
  Reply Send(redisContext* ctx, const std::vector<std::string>& argv, bool& broken) const;

  Options options_;
  Address address_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<redisContext*> idle_;
  size_t open_ = 0;
  std::mutex shas_mutex_;
  std::vector<std::pair<const Script*, std::string>> shas_;
};

}  // namespace idemsaga::common::redis
