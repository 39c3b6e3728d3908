// Load generator for the benchmark: an event-driven HTTP/1.1 client on Boost.Asio. C persistent
// connections (spread over --threads io_context threads, each thread its own context) each send
// one request at a time: the whole request (line, headers and body) is serialised into one
// buffer and written at once on a TCP_NODELAY socket, so no request waits on a delayed ACK.
// Closed loop by default (a connection sends its next request when the last is answered); with
// --rate R, open loop: requests are due at R per second whatever the answers, each on an idle
// connection or a new one (up to -c; past it, the request waits for one), and latency runs
// from when the request was due, so a slow server is not hidden by a client that waited for it
// (coordinated omission).
// Responses are parsed (status line, Content-Length or chunked, `Connection: close` -> a new
// connection for the next request, Retry-After noted). Prints one JSON line: throughput,
// latency percentiles, status counts (0 = no answer: timeout, reset, refused, cut short).
//
//   loadgen --url http://127.0.0.1:8080 --api-key dev-key-demo -n 2000 -c 16
//   loadgen --url http://127.0.0.1:8082 --path /v1/charges --service-token dev-service-token ...
//   loadgen ... --same-key K --duration 10          every request replays key K for 10 s
//   loadgen ... --body-bytes 61440 --malformed --accept 400   a flood of junk bodies
//   loadgen ... --rate 200 --duration 60 -c 2048   open loop: 200 requests/s for 60 s
//   loadgen --url http://127.0.0.1:18090 --path /orders/place --key-header X-Order-Key ...
//                                                    a peer's ingress (bench/peers/)
//
// Exit status 0 iff every request got an accepted answer: 2xx, or a code named by --accept
// (503 only with Retry-After). Latency runs from issuing the request (open loop: from when it was
// due), including a connect when the connection had to be (re)opened, to the last byte of its
// response.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string host;
  std::string port;
  std::string path = "/v1/orders";
  std::string api_key, service_token, tenant = "bench";
  std::string prefix = "bench";
  std::string same_key;
  std::string key_header;  // also send the key in this header (a peer that needs it twice)
  std::string body;        // "": the usual body for the path
  double rate = 0;         // > 0: open loop at this many requests per second
  long long n = 1000;
  double duration_s = 0;  // > 0: run for this long instead of -n requests
  int concurrency = 16;
  int threads = 1;
  int timeout_ms = 30000;
  long long body_bytes = 0;  // 0: the usual small body
  bool malformed = false;
  std::set<int> accept;
};

// What the run shares between threads: which request comes next, and when to stop.
struct Shared {
  std::atomic<long long> next{0};
  long long n = 0;
  std::optional<Clock::time_point> deadline;

  // The next request's index, or -1 when the run is over.
  long long Claim() {
    if (deadline && Clock::now() >= *deadline) return -1;
    long long i = next.fetch_add(1, std::memory_order_relaxed);
    return deadline || i < n ? i : -1;
  }
};

// Per thread: merged at the end.
struct Results {
  std::vector<double> latencies_ms;
  std::map<int, std::vector<double>> latencies_by_status;  // only when statuses are mixed
  std::vector<double> connect_ms;  // each successful connect: SYN to established
  std::map<int, long long> statuses;
  std::map<int, long long> with_retry_after;   // status -> answers that carried Retry-After
  std::map<std::string, long long> no_answer;  // why a request counts as status 0
  long long connects = 0;                      // connections opened (the first ones included)
  long long closed_by_server = 0;              // answers with `Connection: close`
  long long waited_for_connection = 0;         // open loop: due while all -c were busy
  long long connections_used = 0;              // open loop: connections made for the schedule
  long long bytes_sent = 0;
  Clock::time_point last_done{};
};

bool IEqualsPrefix(std::string_view s, std::string_view lower_prefix) {
  if (s.size() < lower_prefix.size()) return false;
  for (size_t i = 0; i < lower_prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != lower_prefix[i]) return false;
  }
  return true;
}

std::string_view Trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r'))
    v.remove_suffix(1);
  return v;
}

bool ContainsTokenIgnoreCase(std::string_view v, std::string_view lower_token) {
  std::string lower(v);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower.find(lower_token) != std::string::npos;
}

// One HTTP/1.1 response, parsed incrementally from the bytes received so far.
struct ResponseParser {
  enum class State { kHeaders, kBody, kChunked, kUntilClose, kDone, kBad };
  State state = State::kHeaders;
  int status = 0;
  bool retry_after = false;
  bool close = false;
  size_t body_start = 0;
  size_t content_length = 0;
  size_t chunk_pos = 0;  // chunked: where the next chunk-size line starts

  void Reset() { *this = ResponseParser{}; }

  // Parses what `buf` holds now; returns the state reached.
  State Feed(std::string& buf) {
    if (state == State::kHeaders) ParseHeaders(buf);
    if (state == State::kBody && buf.size() >= body_start + content_length) state = State::kDone;
    if (state == State::kChunked) ParseChunks(buf);
    return state;
  }

 private:
  void ParseHeaders(std::string& buf) {
    for (;;) {
      auto end = buf.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (buf.size() > 64 * 1024) state = State::kBad;
        return;
      }
      std::string_view head(buf.data(), end);
      // Status line: HTTP/1.x SP NNN SP reason
      if (head.size() < 12 || !IEqualsPrefix(head, "http/1.")) {
        state = State::kBad;
        return;
      }
      int code = 0;
      for (size_t i = 9; i < 12; ++i) {
        if (head[i] < '0' || head[i] > '9') {
          state = State::kBad;
          return;
        }
        code = code * 10 + (head[i] - '0');
      }
      bool http10 = head[7] == '0';
      bool keep_alive = false, chunked = false, has_length = false;
      size_t length = 0;
      bool retry = false, conn_close = false;
      size_t pos = head.find("\r\n");
      while (pos != std::string_view::npos && pos < head.size()) {
        size_t start = pos + 2;
        size_t next = head.find("\r\n", start);
        std::string_view line = head.substr(
            start, next == std::string_view::npos ? std::string_view::npos : next - start);
        auto colon = line.find(':');
        if (colon != std::string_view::npos) {
          std::string_view name = line.substr(0, colon);
          std::string_view value = Trim(line.substr(colon + 1));
          if (name.size() == 14 && IEqualsPrefix(name, "content-length")) {
            has_length = true;
            length = std::strtoull(std::string(value).c_str(), nullptr, 10);
          } else if (name.size() == 10 && IEqualsPrefix(name, "connection")) {
            conn_close = conn_close || ContainsTokenIgnoreCase(value, "close");
            keep_alive = keep_alive || ContainsTokenIgnoreCase(value, "keep-alive");
          } else if (name.size() == 17 && IEqualsPrefix(name, "transfer-encoding")) {
            chunked = ContainsTokenIgnoreCase(value, "chunked");
          } else if (name.size() == 11 && IEqualsPrefix(name, "retry-after")) {
            retry = true;
          }
        }
        pos = next;
      }
      if (code >= 100 && code < 200) {  // interim (we never send Expect): skip it
        buf.erase(0, end + 4);
        continue;
      }
      status = code;
      retry_after = retry;
      close = conn_close || (http10 && !keep_alive);
      body_start = end + 4;
      if (code == 204 || code == 304) {
        content_length = 0;
        state = State::kBody;
      } else if (chunked) {
        chunk_pos = body_start;
        state = State::kChunked;
      } else if (has_length) {
        content_length = length;
        state = State::kBody;
      } else {
        close = true;
        state = State::kUntilClose;
      }
      return;
    }
  }

  void ParseChunks(const std::string& buf) {
    for (;;) {
      auto eol = buf.find("\r\n", chunk_pos);
      if (eol == std::string::npos) return;
      size_t size = std::strtoull(buf.substr(chunk_pos, eol - chunk_pos).c_str(), nullptr, 16);
      if (size == 0) {
        // Trailers (none expected) end with an empty line.
        auto end = buf.find("\r\n\r\n", eol);
        if (end == std::string::npos && buf.compare(eol, 4, "\r\n\r\n") != 0) return;
        state = State::kDone;
        return;
      }
      if (buf.size() < eol + 2 + size + 2) return;
      chunk_pos = eol + 2 + size + 2;
    }
  }
};

// One request to send: its index (the key's suffix) and when it counts from.
struct Job {
  long long index = 0;
  Clock::time_point t0;
};

class Connection;
// Gives a connection that has become free (answered, failed, or new) its next request, or
// closes it, or keeps it idle.
using Free = std::function<void(Connection&)>;

class Connection {
 public:
  Connection(asio::io_context& io, const Config& cfg, const tcp::endpoint& endpoint,
             const std::string& head, const std::string& tail, Free free, Results& results)
      : cfg_(cfg),
        endpoint_(endpoint),
        head_(head),
        tail_(tail),
        free_(std::move(free)),
        results_(results),
        socket_(io),
        timer_(io),
        retry_timer_(io) {
    read_buf_.resize(16 * 1024);
  }

  void Issue(Job job) {
    ++gen_;
    const long long i = job.index;
    request_.clear();
    request_ += head_;
    const size_t key_at = request_.size();
    if (cfg_.same_key.empty()) {
      request_ += cfg_.prefix;
      request_ += '-';
      request_ += std::to_string(i);
    } else {
      request_ += cfg_.same_key;
    }
    if (!cfg_.key_header.empty()) {
      const std::string key = request_.substr(key_at);
      request_ += "\r\n";
      request_ += cfg_.key_header;
      request_ += ": ";
      request_ += key;
    }
    request_ += tail_;
    response_.clear();
    parser_.Reset();
    t0_ = job.t0;
    timer_.expires_after(std::chrono::milliseconds(cfg_.timeout_ms));
    timer_.async_wait([this, g = gen_](boost::system::error_code ec) {
      if (ec || g != gen_) return;
      Fail("timeout");
    });
    if (socket_.is_open()) {
      Write();
    } else {
      Connect();
    }
  }

  void Close() {
    boost::system::error_code ec;
    if (socket_.is_open()) {
      socket_.shutdown(tcp::socket::shutdown_both, ec);
      socket_.close(ec);
    }
  }

 private:
  void Connect() {
    ++results_.connects;
    boost::system::error_code ec;
    socket_.open(endpoint_.protocol(), ec);
    if (ec) {
      Fail("connect");
      return;
    }
    auto t = Clock::now();
    socket_.async_connect(endpoint_, [this, g = gen_, t](boost::system::error_code ec) {
      if (g != gen_) return;
      if (ec) {
        Fail("connect");
        return;
      }
      results_.connect_ms.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - t).count());
      socket_.set_option(tcp::no_delay(true), ec);
      Write();
    });
  }

  void Write() {
    asio::async_write(socket_, asio::buffer(request_),
                      [this, g = gen_](boost::system::error_code ec, size_t n) {
                        if (g != gen_) return;
                        if (ec) {
                          Fail(ec == asio::error::connection_reset ? "reset" : "write");
                          return;
                        }
                        results_.bytes_sent += static_cast<long long>(n);
                        Read();
                      });
  }

  void Read() {
    socket_.async_read_some(
        asio::buffer(read_buf_), [this, g = gen_](boost::system::error_code ec, size_t n) {
          if (g != gen_) return;
          if (ec) {
            if (ec == asio::error::eof && parser_.state == ResponseParser::State::kUntilClose) {
              Complete();
            } else if (ec == asio::error::eof) {
              Fail(response_.empty() ? "closed" : "cut_short");
            } else {
              Fail(ec == asio::error::connection_reset ? "reset" : "read");
            }
            return;
          }
          response_.append(read_buf_.data(), n);
          switch (parser_.Feed(response_)) {
            case ResponseParser::State::kDone:
              Complete();
              return;
            case ResponseParser::State::kBad:
              Fail("bad_response");
              return;
            default:
              Read();
          }
        });
  }

  void Record(int status, bool retry_after) {
    auto now = Clock::now();
    double ms = std::chrono::duration<double, std::milli>(now - t0_).count();
    results_.latencies_ms.push_back(ms);
    results_.latencies_by_status[status].push_back(ms);
    ++results_.statuses[status];
    if (retry_after) ++results_.with_retry_after[status];
    results_.last_done = now;
  }

  void Complete() {
    timer_.cancel();
    Record(parser_.status, parser_.retry_after);
    if (parser_.close) {
      ++results_.closed_by_server;
      Close();
    }
    free_(*this);
  }

  // No answer: status 0. The connection is dropped; the next request opens a new one (after a
  // pause when the server refused it, so a dead server does not make a busy loop).
  void Fail(const char* why) {
    timer_.cancel();
    Record(0, false);
    ++results_.no_answer[why];
    Close();
    if (std::string_view(why) == "connect") {
      ++gen_;
      retry_timer_.expires_after(std::chrono::milliseconds(20));
      retry_timer_.async_wait([this, g = gen_](boost::system::error_code ec) {
        if (!ec && g == gen_) free_(*this);
      });
      return;
    }
    free_(*this);
  }

  const Config& cfg_;
  tcp::endpoint endpoint_;
  const std::string& head_;
  const std::string& tail_;
  Free free_;
  Results& results_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::steady_timer retry_timer_;
  unsigned long long gen_ = 0;  // handlers of an earlier request (or connection) are stale
  std::string request_;
  std::string response_;
  std::vector<char> read_buf_;
  ResponseParser parser_;
  Clock::time_point t0_;
};

// The open loop on one io_context thread: the k-th request of this thread is due at
// start + (k * threads + thread) / rate, until the end; each goes to an idle connection, or a
// new one while fewer than `max_connections` exist, or waits in order for the first one free.
class OpenLoop {
 public:
  OpenLoop(asio::io_context& io, const Config& cfg, const tcp::endpoint& endpoint,
           const std::string& head, const std::string& tail, Results& results, int thread,
           int threads, int max_connections, Clock::time_point start, Clock::time_point end)
      : io_(io),
        cfg_(cfg),
        endpoint_(endpoint),
        head_(head),
        tail_(tail),
        results_(results),
        thread_(thread),
        threads_(threads),
        max_connections_(max_connections),
        start_(start),
        end_(end),
        timer_(io) {}

  void Start() { Tick(); }

 private:
  long long Index(long long k) const { return k * threads_ + thread_; }
  Clock::time_point Due(long long k) const {
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                        static_cast<double>(Index(k)) / cfg_.rate));
  }

  void Tick() {
    const auto now = Clock::now();
    for (; Due(k_) <= now && Due(k_) < end_; ++k_) Dispatch({Index(k_), Due(k_)});
    if (Due(k_) < end_) {
      timer_.expires_at(Due(k_));
      timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) Tick();
      });
      return;
    }
    done_ = true;
    for (auto& [c, since] : idle_) c->Close();
    idle_.clear();
  }

  void Dispatch(Job job) {
    if (!idle_.empty()) {
      auto [c, since] = idle_.back();
      idle_.pop_back();
      // The server closes a connection idle for its keep-alive timeout (2 s): a request sent
      // on it as it does would meet a close, not the server. Reconnect well before.
      if (Clock::now() - since > kIdleReuse) c->Close();
      c->Issue(job);
    } else if (static_cast<int>(conns_.size()) < max_connections_) {
      conns_.push_back(std::make_unique<Connection>(
          io_, cfg_, endpoint_, head_, tail_, [this](Connection& c) { Freed(c); }, results_));
      ++results_.connections_used;
      conns_.back()->Issue(job);
    } else {
      ++results_.waited_for_connection;
      pending_.push_back(job);
    }
  }

  void Freed(Connection& c) {
    if (!pending_.empty()) {
      auto job = pending_.front();
      pending_.pop_front();
      c.Issue(job);
    } else if (done_) {
      c.Close();
    } else {
      idle_.emplace_back(&c, Clock::now());
    }
  }

  static constexpr auto kIdleReuse = std::chrono::milliseconds(1000);

  asio::io_context& io_;
  const Config& cfg_;
  const tcp::endpoint& endpoint_;
  const std::string& head_;
  const std::string& tail_;
  Results& results_;
  const int thread_, threads_, max_connections_;
  const Clock::time_point start_, end_;
  asio::steady_timer timer_;
  long long k_ = 0;
  bool done_ = false;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::vector<std::pair<Connection*, Clock::time_point>> idle_;  // and since when
  std::deque<Job> pending_;
};

std::string MakeBody(const Config& cfg) {
  if (!cfg.body.empty()) return cfg.body;
  // The order body for /v1/orders, for the order sagas' runs routes and for the peers' order
  // routes (bench/peers: Restate's /orders/place, DBOS's /orders).
  const bool orders = cfg.path == "/v1/orders" || cfg.path.rfind("/v1/runs/place_order", 0) == 0 ||
                      cfg.path == "/orders/place" || cfg.path == "/orders";
  std::string body =
      orders
          ? R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":1}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_visa"})"
          : R"({"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"})";
  if (cfg.body_bytes <= 0) return body;
  auto n = static_cast<size_t>(cfg.body_bytes);
  if (cfg.malformed) {
    // Invalid JSON of exactly n bytes: an object whose string never ends, with junk that
    // includes quotes, braces and escapes a parser has to walk through.
    static const std::string junk = R"(x{"[\q,]:}' 0xZZ \u12 )";
    std::string out = R"({"customer_id":")";
    while (out.size() < n) out += junk;
    out.resize(n);
    return out;
  }
  // Valid JSON of n bytes: the usual body with a padding field.
  body.pop_back();  // '}'
  body += R"(,"padding":")";
  if (body.size() + 2 < n) body.append(n - body.size() - 2, 'p');
  body += "\"}";
  return body;
}

void RaiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  std::string url;
  std::vector<int> accept;
  CLI::App app{"idemsaga load generator"};
  app.add_option("--url", url, "http://HOST:PORT")->required();
  app.add_option(
      "--path", cfg.path,
      "/v1/orders (or /v1/runs/place_order_parallel), or /v1/charges for the participant baseline");
  app.add_option("--api-key", cfg.api_key, "tenant API key (orders)");
  app.add_option("--service-token", cfg.service_token, "service token (participant baseline)");
  app.add_option("--tenant", cfg.tenant, "X-Tenant-ID sent with --service-token")
      ->capture_default_str();
  app.add_option("--prefix", cfg.prefix, "key prefix; keys are <prefix>-<i>");
  auto* n_opt = app.add_option("-n", cfg.n, "requests")->check(CLI::Range(1LL, 100000000LL));
  app.add_option("--duration", cfg.duration_s, "run for S seconds instead of -n requests")
      ->check(CLI::Range(0.1, 86400.0))
      ->excludes(n_opt);
  app.add_option("-c", cfg.concurrency, "connections, one request in flight on each")
      ->check(CLI::Range(1, 16384));
  app.add_option("--threads", cfg.threads, "io_context threads")->check(CLI::Range(1, 8));
  app.add_option("--same-key", cfg.same_key, "every request uses this key (replays)");
  app.add_option("--body", cfg.body, "the request body (JSON) instead of the usual one");
  app.add_option("--key-header", cfg.key_header,
                 "also send the key in this header (Restate's ingress keeps Idempotency-Key to "
                 "itself)");
  app.add_option("--rate", cfg.rate,
                 "open loop: R requests per second for --duration, on up to -c connections; "
                 "latency from when each was due")
      ->check(CLI::Range(0.1, 1000000.0));
  app.add_option("--timeout-ms", cfg.timeout_ms, "no answer by then: status 0")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  app.add_option("--body-bytes", cfg.body_bytes, "body of N bytes (valid JSON, padded)")
      ->check(CLI::Range(1LL, 1LL << 30));
  app.add_flag("--malformed", cfg.malformed, "with --body-bytes: invalid JSON instead");
  app.add_option("--accept", accept,
                 "also a success: this status (repeatable; 503 only with Retry-After)");
  CLI11_PARSE(app, argc, argv);
  cfg.accept.insert(accept.begin(), accept.end());
  if (cfg.rate > 0 && cfg.duration_s <= 0) {
    std::cerr << "loadgen: --rate needs --duration\n";
    return 2;
  }
  if (cfg.key_header.find_first_of(":\r\n \t") != std::string::npos) {
    std::cerr << "loadgen: --key-header must be a header name\n";
    return 2;
  }
  if (cfg.malformed && cfg.body_bytes <= 0) {
    std::cerr << "loadgen: --malformed needs --body-bytes\n";
    return 2;
  }
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    std::cerr << "loadgen: --url must be http://HOST:PORT\n";
    return 2;
  }
  std::string authority = url.substr(scheme.size());
  if (auto slash = authority.find('/'); slash != std::string::npos) authority.resize(slash);
  auto colon = authority.rfind(':');
  cfg.host = colon == std::string::npos ? authority : authority.substr(0, colon);
  cfg.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  RaiseFileLimit();

  tcp::endpoint endpoint;
  try {
    asio::io_context io;
    tcp::resolver resolver(io);
    endpoint = *resolver.resolve(cfg.host, cfg.port).begin();
  } catch (const std::exception& e) {
    std::cerr << "loadgen: cannot resolve " << authority << ": " << e.what() << "\n";
    return 2;
  }

  // The request, up to the key and after it: only the key changes between requests.
  const std::string body = MakeBody(cfg);
  std::string head = "POST " + cfg.path + " HTTP/1.1\r\nHost: " + authority + "\r\n";
  if (!cfg.service_token.empty()) {
    head +=
        "Authorization: Bearer " + cfg.service_token + "\r\nX-Tenant-ID: " + cfg.tenant + "\r\n";
  } else if (!cfg.api_key.empty()) {
    head += "Authorization: Bearer " + cfg.api_key + "\r\n";
  }
  head += "Idempotency-Key: ";
  const std::string tail =
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;

  Shared shared;
  shared.n = cfg.n;
  const int threads = std::min(cfg.threads, cfg.concurrency);
  std::vector<Results> results(threads);
  if (cfg.duration_s <= 0) {
    for (auto& r : results) r.latencies_ms.reserve(cfg.n / threads + 1);
  }
  rusage before{};
  getrusage(RUSAGE_SELF, &before);
  auto start = Clock::now();
  if (cfg.duration_s > 0) {
    shared.deadline = start + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(cfg.duration_s));
  }
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      asio::io_context io(1);
      if (cfg.rate > 0) {
        // Each thread may open its share of -c (the first ones one more).
        const int max_connections = cfg.concurrency / threads + (t < cfg.concurrency % threads);
        OpenLoop loop(io, cfg, endpoint, head, tail, results[t], t, threads, max_connections, start,
                      *shared.deadline);
        loop.Start();
        io.run();
        return;
      }
      auto next = [&shared](Connection& c) {
        long long i = shared.Claim();
        if (i < 0) {
          c.Close();
        } else {
          c.Issue({i, Clock::now()});
        }
      };
      std::vector<std::unique_ptr<Connection>> conns;
      for (int c = t; c < cfg.concurrency; c += threads) {
        conns.push_back(
            std::make_unique<Connection>(io, cfg, endpoint, head, tail, next, results[t]));
      }
      for (auto& c : conns) next(*c);
      io.run();
    });
  }
  for (auto& w : workers) w.join();
  rusage after{};
  getrusage(RUSAGE_SELF, &after);

  Results all;
  all.last_done = start;
  for (auto& r : results) {
    all.latencies_ms.insert(all.latencies_ms.end(), r.latencies_ms.begin(), r.latencies_ms.end());
    for (auto& [s, l] : r.latencies_by_status) {
      auto& to = all.latencies_by_status[s];
      to.insert(to.end(), l.begin(), l.end());
    }
    all.connect_ms.insert(all.connect_ms.end(), r.connect_ms.begin(), r.connect_ms.end());
    for (auto [s, c] : r.statuses) all.statuses[s] += c;
    for (auto [s, c] : r.with_retry_after) all.with_retry_after[s] += c;
    for (auto& [w, c] : r.no_answer) all.no_answer[w] += c;
    all.connects += r.connects;
    all.closed_by_server += r.closed_by_server;
    all.waited_for_connection += r.waited_for_connection;
    all.connections_used += r.connections_used;
    all.bytes_sent += r.bytes_sent;
    all.last_done = std::max(all.last_done, r.last_done);
  }
  std::sort(all.latencies_ms.begin(), all.latencies_ms.end());
  std::sort(all.connect_ms.begin(), all.connect_ms.end());
  const auto requests = static_cast<long long>(all.latencies_ms.size());
  const double seconds = std::chrono::duration<double>(all.last_done - start).count();
  auto cpu = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
  };
  const double cpu_s = cpu(after) - cpu(before);

  bool ok = requests > 0;
  for (auto [s, c] : all.statuses) {
    bool good = s / 100 == 2 ||
                (s != 0 && cfg.accept.count(s) > 0 && (s != 503 || all.with_retry_after[s] == c));
    ok = ok && good;
  }
  nlohmann::json out = {{"path", cfg.path},
                        {"requests", requests},
                        {"concurrency", cfg.concurrency},
                        {"threads", threads},
                        {"seconds", seconds},
                        {"per_second", seconds > 0 ? static_cast<double>(requests) / seconds : 0},
                        {"p50_ms", Percentile(all.latencies_ms, 0.50)},
                        {"p90_ms", Percentile(all.latencies_ms, 0.90)},
                        {"p99_ms", Percentile(all.latencies_ms, 0.99)},
                        {"max_ms", all.latencies_ms.empty() ? 0 : all.latencies_ms.back()},
                        {"statuses", nlohmann::json::object()},
                        {"with_retry_after", nlohmann::json::object()},
                        {"no_answer", nlohmann::json::object()},
                        {"connects", all.connects},
                        {"connect_p50_ms", Percentile(all.connect_ms, 0.50)},
                        {"connect_p99_ms", Percentile(all.connect_ms, 0.99)},
                        {"connect_max_ms", all.connect_ms.empty() ? 0 : all.connect_ms.back()},
                        {"closed_by_server", all.closed_by_server},
                        {"body_bytes", body.size()},
                        {"bytes_sent", all.bytes_sent},
                        {"cpu_seconds", cpu_s},
                        {"cpu_percent", seconds > 0 ? 100 * cpu_s / seconds : 0},
                        {"ok", ok}};
  if (cfg.rate > 0) {
    out["rate"] = cfg.rate;
    out["connections_used"] = all.connections_used;
    out["waited_for_connection"] = all.waited_for_connection;
  }
  for (auto [s, c] : all.statuses) out["statuses"][std::to_string(s)] = c;
  for (auto [s, c] : all.with_retry_after) out["with_retry_after"][std::to_string(s)] = c;
  for (auto& [w, c] : all.no_answer) out["no_answer"][w] = c;
  // Latency per status when answers differ (an overload: fast 503s, slow 2xx).
  if (all.latencies_by_status.size() > 1) {
    for (auto& [s, l] : all.latencies_by_status) {
      std::sort(l.begin(), l.end());
      out["latency_by_status"][std::to_string(s)] = {
          {"p50_ms", Percentile(l, 0.50)}, {"p99_ms", Percentile(l, 0.99)}, {"max_ms", l.back()}};
    }
  }
  std::cout << out.dump() << std::endl;
  return ok ? 0 : 1;
}
