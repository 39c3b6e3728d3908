// What a careless or hostile client can send, and what idemsaga::common::http::Server makes of it:
// header bytes reach the handler unaltered; a path is decoded once and never reaches a route
// truncated or altered; oversized, malformed and randomly mutated requests get a 4xx with the
// JSON error body (or a closed connection), never a 5xx, and memory stays flat.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/edge/edge_server.hpp"
#include "tests/edge/raw_client.hpp"

namespace {

// A sanitizer's allocator keeps freed memory in quarantine, so RSS grows with every
// allocation; the bound then only tells "not every flood kept whole" (80 MiB were sent).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr long long kRssBound = 64LL << 20;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr long long kRssBound = 64LL << 20;
#else
constexpr long long kRssBound = 8LL << 20;
#endif
#else
constexpr long long kRssBound = 8LL << 20;
#endif

using edge::Answer;
using edge::EdgeServer;
using edge::Hex;
using edge::Socket;
using namespace std::chrono_literals;

// Sends `request` on a fresh connection, then the end of input, and returns every answer
// until the server closes.
std::vector<Answer> Exchange(int port, std::string_view request) {
  Socket s(port);
  s.Send(request);
  s.ShutdownWrite();
  return s.ReadAll(5s);
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string ErrorCodeOf(const Answer& a) {
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  if (j.is_discarded() || !j.contains("code") ||
      j["type"] != "https://idemsaga.dev/problems/" + j["code"].get<std::string>()) {
    return "<not a problem body: " + a.body + ">";
  }
  return j["code"].get<std::string>();
}

TEST(ServerInput, HeaderValuesReachTheHandlerByteForByte) {
  EdgeServer server;
  auto answers = Exchange(server.port,
                          "GET /echo HTTP/1.1\r\n"
                          "Host: x\r\n"
                          "Idempotency-Key: pct%41-X\r\n"
                          "X-Plus: a+b%2B\r\n"
                          "X-Quoted: \" lead and trail \"\r\n"
                          "X-Escaped: \"a\\\"b\"\r\n"
                          "X-Inner: \t a \t  b  \t\r\n"
                          "X-Obs-Text: caf\xC3\xA9 \xFF\r\n"
                          "X-Empty:\r\n"
                          "x-dup: one\r\n"
                          "X-Dup: two\r\n"
                          "\r\n");
  ASSERT_EQ(answers.size(), 1u);
  ASSERT_EQ(answers[0].status, 200) << answers[0].body;
  auto headers = nlohmann::json::parse(answers[0].body)["headers"];
  auto values = [&](const std::string& name) {
    std::vector<std::string> out;
    for (const auto& h : headers) {
      if (h[0].get<std::string>() == name) out.push_back(Unhex(h[1].get<std::string>()));
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(values("Idempotency-Key"), V{"pct%41-X"});
  EXPECT_EQ(values("X-Plus"), V{"a+b%2B"});
  EXPECT_EQ(values("X-Quoted"), V{"\" lead and trail \""});
  EXPECT_EQ(values("X-Escaped"), V{"\"a\\\"b\""});
  EXPECT_EQ(values("X-Inner"), V{"a \t  b"});  // only the whitespace around the value goes
  EXPECT_EQ(values("X-Obs-Text"), V{"caf\xC3\xA9 \xFF"});
  EXPECT_EQ(values("X-Empty"), V{""});
  // Both lines, in order, names as sent: a handler can see a duplicate and refuse it.
  EXPECT_EQ(values("x-dup"), V{"one"});
  EXPECT_EQ(values("X-Dup"), V{"two"});

  // The same through cpp-httplib's client, as the services call each other.
  httplib::Client client("127.0.0.1", server.port);
  auto r = client.Get("/echo", {{"Idempotency-Key", "dk%2541-X"}, {"X-Quoted", "\" lead\""}});
  ASSERT_TRUE(r);
  auto seen = nlohmann::json::parse(r->body)["headers"];
  std::map<std::string, std::string> by_name;
  for (const auto& h : seen) by_name[h[0].get<std::string>()] = Unhex(h[1].get<std::string>());
  EXPECT_EQ(by_name["Idempotency-Key"], "dk%2541-X");
  EXPECT_EQ(by_name["X-Quoted"], "\" lead\"");
}

TEST(ServerInput, APathIsDecodedOnceAndNeverReachesARouteTruncated) {
  EdgeServer server;
  struct Case {
    std::string target;
    int status;
    std::string key;  // what the route sees, when 200
  };
  std::vector<Case> cases = {
      {"/v1/orders/pct%41-X", 200, "pctA-X"},
      {"/v1/orders/dk%2541-X", 200, "dk%41-X"},
      {"/v1/orders/a+b", 200, "a+b"},
      {"/v1/orders/q%22a%5C%22b%22", 200, "q\"a\\\"b\""},
      {"/v1/orders/caf%C3%A9", 200, "caf\xC3\xA9"},
      // An encoded "/" belongs to the key: never a sub-resource of a shorter key.
      {"/v1/orders/k%2Ftrace", 200, "k/trace"},
      {"/v1/orders/k%2ftrace", 200, "k/trace"},
      {"/v1/orders/k%252Ftrace", 200, "k%2Ftrace"},
      {"/v1/orders/a%2F%2Fb%25", 200, "a//b%"},
      {"/v1/orders/k%00junk", 400, ""},
      {std::string("/v1/orders/k\0junk", 17), 400, ""},
      {"/v1/orders/%FF", 400, ""},
      {"/v1/orders/%C0%AF", 400, ""},        // overlong
      {"/v1/orders/%ED%A0%80", 400, ""},     // surrogate
      {"/v1/orders/%F4%90%80%80", 400, ""},  // beyond U+10FFFF
      {"/v1/orders/%E2%82", 400, ""},        // truncated sequence
      {"/v1/orders/bad%zz", 400, ""},
      {"/v1/orders/bad%4", 400, ""},
      {"/v1/orders/raw\xC3\xA9", 400, ""},  // raw non-ASCII
      {"/echo?a=%00", 400, ""},
      {"/echo?a=%FF", 400, ""},
      {"http://x/echo", 400, ""},
      {"*", 400, ""},
  };
  for (const auto& c : cases) {
    auto answers = Exchange(server.port, "GET " + c.target + " HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_EQ(answers.size(), 1u) << Hex(c.target);
    EXPECT_EQ(answers[0].status, c.status) << Hex(c.target) << " " << answers[0].body;
    if (c.status == 200) {
      EXPECT_EQ(Unhex(nlohmann::json::parse(answers[0].body)["key"]), c.key) << c.target;
    } else {
      EXPECT_EQ(ErrorCodeOf(answers[0]), "bad_request") << Hex(c.target);
      EXPECT_EQ(answers[0].Header("Connection"), "close");
    }
  }
  // A literal "/" does separate: this is the trace of "k/trace".
  auto trace = Exchange(server.port, "GET /v1/orders/k%2Ftrace/trace HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(trace.size(), 1u);
  EXPECT_EQ(Unhex(nlohmann::json::parse(trace[0].body)["trace_of"]), "k/trace");
  // The query is decoded as a form (`+` is a space) for get_param_value.
  auto answers = Exchange(server.port, "GET /echo?a=1+2%2B&b HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(answers.size(), 1u);
  auto params = nlohmann::json::parse(answers[0].body)["params"];
  EXPECT_EQ(Unhex(params[Hex("a")]), "1 2+");
  EXPECT_EQ(Unhex(params[Hex("b")]), "");
}

TEST(ServerInput, MalformedFramingIsA4xxWithTheErrorBodyNeverA5xx) {
  EdgeServer server;
  const std::string get = "GET /echo HTTP/1.1\r\nHost: x\r\n";
  const std::string post = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  struct Case {
    std::string name;
    std::string request;
    int status;
    std::string code = "bad_request";
  };
  std::vector<Case> cases = {
      {"CL then TE", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       400},
      {"TE then CL", post + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
       400},
      {"TE gzip with CL", post + "Transfer-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", 400},
      {"TE gzip", post + "Transfer-Encoding: gzip\r\n\r\n{}", 400},
      {"TE chunked, gzip", post + "Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", 400},
      {"TE twice", post + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"TE in HTTP/1.0",
       "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400},
      {"chunk size not hex", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", 400},
      {"chunk size overflow",
       post + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n{}\r\n0\r\n\r\n", 400},
      {"chunk without CRLF", post + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n", 400},
      {"chunk extension", post + "Transfer-Encoding: chunked\r\n\r\n2;\x01\r\n{}\r\n0\r\n\r\n",
       400},
      {"chunked body over the limit",
       post + "Transfer-Encoding: chunked\r\n\r\n10001\r\n" + std::string(0x10001, ' ') +
           "\r\n0\r\n\r\n",
       413, "payload_too_large"},
      {"CL negative", post + "Content-Length: -1\r\n\r\n", 400},
      {"CL not a number", post + "Content-Length: abc\r\n\r\n", 400},
      {"CL plus sign", post + "Content-Length: +2\r\n\r\n{}", 400},
      {"CL list that disagrees", post + "Content-Length: 1, 2\r\n\r\n{}", 400},
      {"CL twice, different", post + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400},
      {"CL huge", post + "Content-Length: 99999999999999999999999\r\n\r\n", 400},
      {"CL over the body limit, body never sent", post + "Content-Length: 100000\r\n\r\n", 413,
       "payload_too_large"},
      {"Content-Encoding gzip", post + "Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}", 415,
       "unsupported_content_encoding"},
      {"body shorter than CL, then EOF", post + "Content-Length: 10\r\n\r\n{}", 400},
      {"header cut short, then EOF", get, 400},
      {"HTTP/0.9", "GET /echo\r\n\r\n", 400},
      {"two spaces", "GET  /echo HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"HTTP/2.0", "GET /echo HTTP/2.0\r\nHost: x\r\n\r\n", 400},
      {"bare LF", "GET /echo HTTP/1.1\nHost: x\n\n", 400},
      {"leading space", " GET /echo HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"extra token", "GET /echo HTTP/1.1 x\r\nHost: x\r\n\r\n", 400},
      {"control in method", std::string("G\x01T /echo HTTP/1.1\r\nHost: x\r\n\r\n"), 400},
      {"obs-fold", get + "X-A: one\r\n two\r\n\r\n", 400},
      {"obs-fold of an empty line", get + "X-A:\r\n two\r\n\r\n", 400},
      {"space in a name", get + "X A: b\r\n\r\n", 400},
      {"space before the colon", get + "X-A : b\r\n\r\n", 400},
      {"no colon", get + "Justtext\r\n\r\n", 400},
      {"NUL in a value", get + std::string("X-A: a\0b\r\n\r\n", 12), 400},
      {"bare CR in a value", get + "X-A: a\rb\r\n\r\n", 400},
      {"unknown method", "BREW /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed"},
      {"method without a route", "DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n", 405,
       "method_not_allowed"},
      {"no such path", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found"},
  };
  for (const auto& c : cases) {
    auto answers = Exchange(server.port, c.request);
    ASSERT_FALSE(answers.empty()) << c.name << ": no answer";
    EXPECT_EQ(answers[0].status, c.status) << c.name << ": " << answers[0].body;
    EXPECT_EQ(ErrorCodeOf(answers[0]), c.code) << c.name;
    EXPECT_EQ(answers[0].Header("Content-Type"), "application/problem+json") << c.name;
  }

  // Allow names the methods that the path has.
  auto refused = Exchange(server.port, "DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(refused[0].Header("Allow"), "GET, HEAD, POST");
}

TEST(ServerInput, HeadAnExceptionAnOutageAndADropAreAnsweredAsDocumented) {
  EdgeServer server;
  {
    Socket s(server.port);
    s.ExpectHeadResponses(true);
    s.Send("HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n");
    auto a = s.Read();
    ASSERT_TRUE(a);
    EXPECT_EQ(a->status, 200);
    EXPECT_NE(a->Header("Content-Length"), "0");  // the GET body's length, not sent
    EXPECT_TRUE(a->body.empty());
    EXPECT_TRUE(s.pending().empty());
  }
  auto bug = Exchange(server.port, "GET /throw HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(bug.size(), 1u);
  EXPECT_EQ(bug[0].status, 500);
  EXPECT_EQ(ErrorCodeOf(bug[0]), "internal_error");

  auto outage = Exchange(server.port, "GET /db-down HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(outage.size(), 1u);
  EXPECT_EQ(outage[0].status, 503);
  EXPECT_EQ(ErrorCodeOf(outage[0]), "unavailable");
  EXPECT_EQ(outage[0].Header("Retry-After"), "1");

  // "Commit, then drop": the client sees the connection closed and not a byte of answer.
  Socket drop(server.port);
  drop.Send("GET /drop HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(drop.ClosedWithin(2s));
  EXPECT_TRUE(drop.pending().empty()) << drop.pending();

  // Keep-alive: three requests, one connection.
  Socket kept(server.port);
  for (int i = 0; i < 3; ++i) {
    kept.Send("GET /work HTTP/1.1\r\nHost: x\r\n\r\n");
    auto a = kept.Read();
    ASSERT_TRUE(a) << i;
    EXPECT_EQ(a->status, 200);
    EXPECT_EQ(a->Header("Connection"), "keep-alive");
  }
}

// A fast handler answers on the event loop, or declines (false, or an exception) and the
// request goes to the worker's handler as if it had never run: nothing it wrote is sent.
TEST(ServerInput, AFastHandlerAnswersOnTheLoopOrLeavesNoTraceOnTheWorkersAnswer) {
  EdgeServer server;
  httplib::Client client("127.0.0.1", server.port);
  for (int round = 0; round < 3; ++round) {  // kept-alive connection: the state resets
    auto fast = client.Post("/fast", {{"X-Fast", "yes"}}, "{}", "application/json");
    ASSERT_TRUE(fast);
    EXPECT_EQ(fast->status, 200);
    EXPECT_EQ(fast->body, R"({"by":"fast","on_loop":true})");
    for (const char* mode : {"no", "throw"}) {
      auto r = client.Post("/fast", {{"X-Fast", mode}}, "{}", "application/json");
      ASSERT_TRUE(r) << mode;
      EXPECT_EQ(r->status, 200) << mode;
      EXPECT_EQ(r->body, R"({"by":"worker","on_loop":false})") << mode;
      EXPECT_FALSE(r->has_header("X-Scribbled")) << mode;
    }
  }
}

TEST(ServerInput, BearerSchemeIsCaseInsensitive) {
  auto token = [](const std::string& value) {
    httplib::Request req;
    req.headers.emplace("Authorization", value);
    return idemsaga::common::http::BearerToken(req);
  };
  EXPECT_EQ(token("Bearer abc"), "abc");
  EXPECT_EQ(token("bearer abc"), "abc");
  EXPECT_EQ(token("BEARER abc"), "abc");
  EXPECT_EQ(token("Bearer   abc"), "abc");
  EXPECT_EQ(token("Bearer"), "");
  EXPECT_EQ(token("Bearer "), "");
  EXPECT_EQ(token("Bearerabc"), "");
  EXPECT_EQ(token("Basic abc"), "");
  EXPECT_EQ(idemsaga::common::http::BearerToken(httplib::Request{}), "");
}

TEST(ServerInput, OversizedHeadersAre431Or414AndMemoryStaysFlat) {
  EdgeServer server;
  const std::string start = "GET /echo HTTP/1.1\r\nHost: x\r\n";
  const std::string one_mib = start + "X-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n";
  std::string many = start;
  for (int i = 0; i < 10000; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  std::string counted = start;  // few bytes, too many fields
  for (int i = 0; i < 101; ++i) counted += "A" + std::to_string(i) + ":\r\n";
  counted += "\r\n";
  const std::string long_line = "GET /" + std::string(size_t{20} * 1024, 'a') + " HTTP/1.1\r\n\r\n";
  const std::string long_target =
      "GET /" + std::string(size_t{9} * 1024, 'a') + " HTTP/1.1\r\n\r\n";

  auto status_of = [&](const std::string& request) {
    Socket s(server.port);
    s.Send(request);  // may fail half way: the server answers and stops reading
    auto a = s.Read(5s);
    if (!a) return 0;
    EXPECT_EQ(a->Header("Connection"), "close");
    return a->status;
  };
  EXPECT_EQ(status_of(one_mib), 431);
  EXPECT_EQ(status_of(many), 431);
  EXPECT_EQ(status_of(counted), 431);
  EXPECT_EQ(status_of(long_line), 414);
  EXPECT_EQ(status_of(long_target), 414);

  // Memory: 40 floods one after another, then 8 clients flooding at once.
  long long before = edge::ResidentBytes();
  int refused = 0;
  for (int i = 0; i < 20; ++i) {
    refused += status_of(one_mib) == 431;
    refused += status_of(many) == 431;
  }
  std::vector<std::thread> clients;
  clients.reserve(8);
  std::atomic<int> parallel_refused{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      for (int i = 0; i < 5; ++i) parallel_refused += status_of(one_mib) == 431;
    });
  }
  for (auto& c : clients) c.join();
  long long delta = edge::ResidentBytes() - before;
  std::printf(
      "header floods: %d of 40 sequential and %d of 40 parallel refused with 431 "
      "(1 MiB of one header, or 10,000 headers); RSS delta %lld KiB\n",
      refused, parallel_refused.load(), delta / 1024);
  EXPECT_EQ(refused, 40);
  EXPECT_EQ(parallel_refused.load(), 40);
  EXPECT_LT(delta, kRssBound) << "the server kept memory for refused headers";

  // Still serving.
  auto ok = Exchange(server.port, "GET /work HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].status, 200);
}

// Valid requests mutated byte-wise with a seeded PRNG: every answer is < 500, and the server
// answers a valid request afterwards.
TEST(ServerInput, ThousandsOfMutatedRequestsGetNo5xx) {
  EdgeServer server({.header_timeout_s = 1, .body_timeout_s = 1});
  const std::string json = "Content-Type: application/json\r\n";
  const std::vector<std::string> seeds = {
      "GET /echo?a=1&b=%41 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"k-1\"\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: x\r\n" + json + "Content-Length: 13\r\n\r\n{\"a\":[1,2,3]}",
      "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n" + json +
          "\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
      "GET /v1/orders/ord%2D1 HTTP/1.1\r\nAuthorization: Bearer t\r\n" +
          std::string("Connection: keep-alive\r\n\r\nGET /work HTTP/1.1\r\nHost: x\r\n\r\n"),
      "HEAD /echo HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
  };
  const std::vector<std::string> tokens = {"\r\n",
                                           "\r\n\r\n",
                                           ":",
                                           " ",
                                           "\t",
                                           "%",
                                           "%00",
                                           std::string(1, '\0'),
                                           "\xff",
                                           "chunked",
                                           "Content-Length: ",
                                           "Transfer-Encoding: chunked\r\n",
                                           "999999999999",
                                           "-1",
                                           "\r\n ",
                                           "Content-Encoding: gzip\r\n",
                                           "?",
                                           "&",
                                           "=",
                                           "HTTP/1.1",
                                           "%C0%AF",
                                           "\n"};
  std::mt19937 rng(20240917);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  auto mutate = [&](std::string s) {
    int edits = 1 + static_cast<int>(pick(4));
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t at = pick(s.size());
      switch (pick(6)) {
        case 0:
          s[at] = static_cast<char>(pick(256));
          break;
        case 1:
          s.insert(at, 1, static_cast<char>(pick(256)));
          break;
        case 2:
          s.erase(at, 1 + pick(8));
          break;
        case 3:
          s.insert(at, s.substr(pick(s.size()), 1 + pick(16)));
          break;
        case 4:
          s.resize(at);
          break;
        default:
          s.insert(at, tokens[pick(tokens.size())]);
      }
    }
    return s;
  };

  constexpr int kRequests = 5000;
  std::map<int, int> by_class;  // 0: closed without an answer
  int answers = 0, fives = 0;
  std::string first_five;
  auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kRequests; ++i) {
    auto request = mutate(seeds[pick(seeds.size())]);
    auto got = Exchange(server.port, request);
    if (got.empty()) ++by_class[0];  // the mutations cut the request to nothing
    for (const auto& a : got) {
      ++answers;
      ++by_class[a.status / 100];
      if (a.status >= 500) {
        ++fives;
        if (first_five.empty()) first_five = Hex(request) + " -> " + a.head + a.body;
      }
    }
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "mutated requests: %d sent in %.1f s; %d answers: 1xx %d, 2xx %d, 4xx %d, 5xx %d; "
      "%d closed without an answer\n",
      kRequests, seconds, answers, by_class[1], by_class[2], by_class[4], fives, by_class[0]);
  EXPECT_EQ(fives, 0) << first_five;
  auto ok = Exchange(server.port, "GET /work HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].status, 200);
}

}  // namespace
