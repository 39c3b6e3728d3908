#include "common/redis/pool.hpp"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <memory>

namespace idemsaga::common::redis {

Address ParseUrl(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.rfind(kScheme, 0) != 0) {
    throw std::invalid_argument("a Redis URL starts with redis:// (got '" + url + "')");
  }
  Address out;
  std::string rest = url.substr(kScheme.size());
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    std::string auth = rest.substr(0, at);
    auto colon = auth.find(':');
    out.password = colon == std::string::npos ? auth : auth.substr(colon + 1);
    rest = rest.substr(at + 1);
  }
  std::string hostport = rest;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    hostport = rest.substr(0, slash);
    std::string db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (db.size() > 4 || db.find_first_not_of("0123456789") != std::string::npos) {
        throw std::invalid_argument("the Redis database in '" + url + "' is not a number");
      }
      out.db = std::stoi(db);
    }
  }
  if (auto colon = hostport.rfind(':'); colon != std::string::npos) {
    std::string port = hostport.substr(colon + 1);
    if (port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
      throw std::invalid_argument("the Redis port in '" + url + "' is not a port number");
    }
    out.port = std::stoi(port);
    hostport = hostport.substr(0, colon);
  }
  if (!hostport.empty()) out.host = hostport;
  return out;
}

namespace {

timeval ToTimeval(std::chrono::milliseconds ms) {
  return {static_cast<time_t>(ms.count() / 1000),
          static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

Reply Copy(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r->type == REDIS_REPLY_STRING   ? Reply::Type::kString
                 : r->type == REDIS_REPLY_STATUS ? Reply::Type::kStatus
                                                 : Reply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(Copy(r->element[i]));
      break;
    default:
      break;
  }
  return out;
}

}  // namespace

Pool::Pool(Options options) : options_(std::move(options)), address_(ParseUrl(options_.url)) {}

Pool::~Pool() {
  for (auto* ctx : idle_) redisFree(ctx);
}

redisContext* Pool::Open() const {
  redisContext* ctx = redisConnectWithTimeout(address_.host.c_str(), address_.port,
                                              ToTimeval(options_.connect_timeout));
  if (ctx == nullptr || ctx->err != 0) {
    std::string why = ctx == nullptr ? "out of memory" : ctx->errstr;
    if (ctx != nullptr) redisFree(ctx);
    throw Unavailable("cannot connect to Redis at " + address_.host + ":" +
                      std::to_string(address_.port) + ": " + why);
  }
  redisSetTimeout(ctx, ToTimeval(options_.command_timeout));
  bool broken = false;
  auto check = [&](const std::vector<std::string>& argv) {
    auto reply = Send(ctx, argv, broken);
    if (broken || reply.type == Reply::Type::kError) {
      redisFree(ctx);
      throw Unavailable("Redis refused " + argv[0] + ": " + reply.str);
    }
  };
  if (!address_.password.empty()) check({"AUTH", address_.password});
  if (address_.db != 0) check({"SELECT", std::to_string(address_.db)});
  return ctx;
}

redisContext* Pool::Borrow(bool& fresh) {
  fresh = false;
  std::unique_lock lock(mutex_);
  if (!available_.wait_for(lock, options_.borrow_timeout,
                           [&] { return !idle_.empty() || open_ < options_.size; })) {
    throw Unavailable("no Redis connection became free in time");
  }
  if (!idle_.empty()) {
    auto* ctx = idle_.back();
    idle_.pop_back();
    return ctx;
  }
  ++open_;
  fresh = true;
  lock.unlock();
  try {
    return Open();
  } catch (...) {
    lock.lock();
    --open_;
    available_.notify_one();
    throw;
  }
}

void Pool::Return(redisContext* ctx, bool broken) {
  std::lock_guard lock(mutex_);
  if (broken) {
    redisFree(ctx);
    --open_;
    for (auto* idle : idle_) redisFree(idle);
    open_ -= idle_.size();
    idle_.clear();
  } else {
    idle_.push_back(ctx);
  }
  available_.notify_one();
}

Reply Pool::Send(redisContext* ctx, const std::vector<std::string>& argv, bool& broken) const {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const auto& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  std::unique_ptr<redisReply, decltype(&freeReplyObject)> reply(
      static_cast<redisReply*>(
          redisCommandArgv(ctx, static_cast<int>(args.size()), args.data(), lens.data())),
      &freeReplyObject);
  if (!reply) {
    // An I/O error or a timeout: the context is unusable (a late reply would be read as the
    // next command's), and whether the command ran is unknown.
    broken = true;
    return {Reply::Type::kError, 0, ctx->errstr, {}};
  }
  return Copy(reply.get());
}

Reply Pool::Run(const std::vector<std::string>& argv) {
  for (int attempt = 1;; ++attempt) {
    bool fresh = false;
    auto* ctx = Borrow(fresh);
    bool broken = false;
    auto reply = Send(ctx, argv, broken);
    Return(ctx, broken);
    if (!broken) return reply;
    if (fresh || attempt > 1) {
      throw Unavailable("Redis did not answer " + argv[0] + ": " + reply.str);
    }
  }
}

Reply Pool::Command(const std::vector<std::string>& argv) {
  auto reply = Run(argv);
  if (reply.type == Reply::Type::kError) throw Error(reply.str);
  return reply;
}

Reply Pool::Eval(const Script& script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args) {
  auto sha_of = [&]() -> std::string {
    std::lock_guard lock(shas_mutex_);
    for (const auto& [s, sha] : shas_) {
      if (s == &script) return sha;
    }
    return "";
  };
  auto load = [&] {
    auto sha = Command({"SCRIPT", "LOAD", script.source}).str;
    std::lock_guard lock(shas_mutex_);
    for (auto& [s, known] : shas_) {
      if (s == &script) {
        known = sha;
        return sha;
      }
    }
    shas_.emplace_back(&script, sha);
    return sha;
  };
  std::string sha = sha_of();
  if (sha.empty()) sha = load();
  std::vector<std::string> argv = {"EVALSHA", sha, std::to_string(keys.size())};
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());
  for (int attempt = 1;; ++attempt) {
    auto reply = Run(argv);
    if (reply.type != Reply::Type::kError) return reply;
    // The server restarted (or flushed its scripts) since the load: load it again. A script
    // that was not found did not run.
    if (reply.str.rfind("NOSCRIPT", 0) == 0 && attempt == 1) {
      argv[1] = load();
      continue;
    }
    throw Error(reply.str);
  }
}

}  // namespace idemsaga::common::redis
