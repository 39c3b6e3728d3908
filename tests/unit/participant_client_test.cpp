// The one table from the wire to what the runner does next.
#include "steps/client/participant_client.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/http/problem.hpp"
#include "steps/client/http_connection.hpp"

namespace {

using idemsaga::steps::client::HttpExchange;
using idemsaga::steps::client::MapOutcome;
using idemsaga::steps::saga::Outcome;
using T = HttpExchange::Transport;

struct Row {
  const char* name;
  HttpExchange exchange;
  Outcome expected;
};

// A participant's error body with `code`.
std::string Problem(const char* code) {
  return idemsaga::common::http::ProblemBody(400, code, "m");
}

TEST(MapOutcome, MapsEveryKindOfAnswerToWhatTheRunnerShouldDo) {
  const std::string busy = Problem("idempotency_key_in_progress");
  const std::string stock = Problem("insufficient_stock");
  std::vector<Row> table = {
      {"connect refused", {T::kNotConnected, 0, "", false, "Connection"}, Outcome::kRetryable},
      {"read timeout after sending", {T::kNoAnswer, 0, "", false, "Read"}, Outcome::kInDoubt},
      {"dropped after sending", {T::kNoAnswer, 0, "", false, "Write"}, Outcome::kInDoubt},
      {"201", {T::kAnswered, 201, R"({"charge_id":"ch_1"})"}, Outcome::kSucceeded},
      {"200 replayed", {T::kAnswered, 200, "{}", true}, Outcome::kSucceeded},
      {"2xx not json", {T::kAnswered, 200, "<html>"}, Outcome::kInDoubt},
      {"409 in progress", {T::kAnswered, 409, busy}, Outcome::kRetryable},
      {"409 insufficient stock", {T::kAnswered, 409, stock}, Outcome::kTerminal},
      {"409 cancelled", {T::kAnswered, 409, Problem("cancelled")}, Outcome::kTerminal},
      {"402 declined", {T::kAnswered, 402, Problem("card_declined")}, Outcome::kTerminal},
      {"409 compensated (a late retry of an undone action)",
       {T::kAnswered, 409, Problem("compensated")},
       Outcome::kTerminal},
      // Not business answers: configuration and protocol faults wait for a fix.
      {"402 with a code the participant never declared",
       {T::kAnswered, 402, Problem("mystery")},
       Outcome::kBlocked},
      {"422 reused", {T::kAnswered, 422, Problem("idempotency_key_reused")}, Outcome::kBlocked},
      {"400 bad request", {T::kAnswered, 400, "{}"}, Outcome::kBlocked},
      {"401 wrong service token", {T::kAnswered, 401, Problem("unauthorized")}, Outcome::kBlocked},
      {"404 wrong URL", {T::kAnswered, 404, Problem("not_found")}, Outcome::kBlocked},
      {"405", {T::kAnswered, 405, ""}, Outcome::kBlocked},
      {"408", {T::kAnswered, 408, ""}, Outcome::kBlocked},
      {"413", {T::kAnswered, 413, Problem("payload_too_large")}, Outcome::kBlocked},
      {"415", {T::kAnswered, 415, ""}, Outcome::kBlocked},
      {"3xx", {T::kAnswered, 302, ""}, Outcome::kBlocked},
      {"429", {T::kAnswered, 429, ""}, Outcome::kRetryable},
      {"500", {T::kAnswered, 500, ""}, Outcome::kRetryable},
      {"503", {T::kAnswered, 503, Problem("unavailable")}, Outcome::kRetryable},
  };
  for (const auto& row : table) {
    EXPECT_EQ(MapOutcome(row.exchange, {"insufficient_stock", "card_declined"}).outcome,
              row.expected)
        << row.name;
  }
}

// A re-sent step whose request changed (a timestamp, a fresh id) is refused by the guard as a
// reuse of its key: the saga stops, stuck, with a detail that names the step rule.
TEST(MapOutcome, AReusedKeyNamesTheRuleThatStepRequestsMustBeDeterministic) {
  auto r = MapOutcome(
      {T::kAnswered, 422, R"({"code":"idempotency_key_reused","detail":"another body"})"});
  EXPECT_EQ(r.outcome, Outcome::kBlocked);
  EXPECT_EQ(r.error_code, "step_request_changed");
  EXPECT_NE(r.detail.find("pure function of the saga's input"), std::string::npos) << r.detail;
  EXPECT_NE(r.detail.find("(step_request_changed)"), std::string::npos) << r.detail;
}

TEST(MapOutcome, HonoursTheParticipantsRetryAfterInSecondsCappedAtAMinute) {
  auto busy = [](std::string retry_after) {
    HttpExchange x{T::kAnswered, 503, "", false, "", std::move(retry_after)};
    return MapOutcome(x).retry_after;
  };
  EXPECT_EQ(busy("3"), std::chrono::seconds(3));
  EXPECT_EQ(busy("0"), std::chrono::seconds(0));
  EXPECT_EQ(busy("86400"), std::chrono::seconds(60));
  EXPECT_EQ(busy(""), std::chrono::seconds(0));
  EXPECT_EQ(busy("Wed, 21 Oct 2015 07:28:00 GMT"), std::chrono::seconds(0));
  EXPECT_EQ(busy("-1"), std::chrono::seconds(0));
}

TEST(MapOutcome, KeepsTheParticipantsErrorCodeStatusAndReplayFlag) {
  auto problem = MapOutcome({T::kAnswered, 402,
                             idemsaga::common::http::ProblemBody(402, "card_declined", "declined!",
                                                                 {{"error", "decoy"}})},
                            {"card_declined"});
  EXPECT_EQ(problem.http_status, 402);
  EXPECT_EQ(problem.outcome, idemsaga::steps::saga::Outcome::kTerminal);
  EXPECT_EQ(problem.error_code, "card_declined");
  EXPECT_EQ(problem.detail, "declined!");
  auto busy = MapOutcome(
      {T::kAnswered, 409,
       idemsaga::common::http::ProblemBody(409, "idempotency_key_in_progress", "later")});
  EXPECT_EQ(busy.outcome, idemsaga::steps::saga::Outcome::kRetryable);
  auto ok = MapOutcome({T::kAnswered, 201, R"({"charge_id":"ch_1"})", true});
  EXPECT_TRUE(ok.replayed);
  EXPECT_EQ(ok.output["charge_id"], "ch_1");
}

}  // namespace

// ---- The connection under the client: real sockets on loopback, a scripted peer.

namespace {

using idemsaga::steps::client::HttpConnection;
using idemsaga::steps::client::ParseHttpBaseUrl;
using namespace std::chrono_literals;

// A one-connection-at-a-time TCP peer on 127.0.0.1: each accepted connection runs `script`
// with the socket, on the peer's thread.
class Peer {
 public:
  explicit Peer(std::function<void(int fd)> script) : script_(std::move(script)) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listen_, 8);
    thread_ = std::thread([this] {
      for (;;) {
        int fd = ::accept(listen_, nullptr, nullptr);
        if (fd < 0) return;
        ++accepted_;
        script_(fd);
        ::close(fd);
      }
    });
  }
  ~Peer() {
    ::shutdown(listen_, SHUT_RDWR);
    ::close(listen_);
    thread_.join();
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  std::function<void(int)> script_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// Reads one request: up to the end of its header plus Content-Length bytes, in as many reads
// as it takes; `reads` counts them.
std::string ReadRequest(int fd, int* reads = nullptr) {
  std::string in;
  char buf[4096];
  for (;;) {
    auto end = in.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t length = 0;
      auto at = in.find("Content-Length: ");
      if (at != std::string::npos && at < end) length = std::stoul(in.substr(at + 16));
      if (in.size() >= end + 4 + length) return in;
    }
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return in;
    if (reads != nullptr) ++*reads;
    in.append(buf, static_cast<size_t>(n));
  }
}

void Write(int fd, std::string_view bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

constexpr std::string_view kRequest =
    "POST /v1/charges HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"k\"\r\nContent-Length: 2\r\n\r\n{}";

using Target = std::pair<std::string, int>;

TEST(ParseHttpBaseUrl, TakesHttpHostAndPortOnly) {
  EXPECT_EQ(ParseHttpBaseUrl("http://127.0.0.1:8081"), (Target{"127.0.0.1", 8081}));
  EXPECT_EQ(ParseHttpBaseUrl("http://inventory/"), (Target{"inventory", 80}));
  for (const char* bad : {"https://a:1", "a:1", "http://", "http://a:1/v1", "http://a:x",
                          "http://a:99999", "http://:80", "http://a:"}) {
    EXPECT_THROW(ParseHttpBaseUrl(bad), std::invalid_argument) << bad;
  }
}

TEST(HttpConnection, SendsTheRequestInOneSegmentAndReadsAChunkedAnswer) {
  std::string got;
  int reads = 0;
  Peer peer([&](int fd) {
    got = ReadRequest(fd, &reads);
    Write(fd,
          "HTTP/1.1 201 Created\r\nIdempotent-Replayed: true\r\nRetry-After: 3\r\n"
          "Transfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n");
    char c;
    ::recv(fd, &c, 1, 0);  // until the client closes
  });
  HttpConnection c("127.0.0.1", peer.port());
  HttpConnection::Answer answer;
  std::string error;
  ASSERT_EQ(c.Exchange(kRequest, 1s, 2s, answer, error), HttpConnection::Failure::kNone) << error;
  EXPECT_EQ(got, kRequest);
  EXPECT_EQ(reads, 1) << "the request must go out in one write";
  EXPECT_EQ(answer.status, 201);
  EXPECT_EQ(answer.body, "{\"a\":1}");
  EXPECT_EQ(answer.replayed, "true");
  EXPECT_EQ(answer.retry_after, "3");
  EXPECT_TRUE(c.reusable());
}

TEST(HttpConnection, KeepsTheConnectionAliveAndReconnectsWhenThePeerClosedIt) {
  Peer peer([&](int fd) {
    for (int i = 0; i < 2; ++i) {
      if (ReadRequest(fd).empty()) return;
      Write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
    }
    // Closes after two answers, as a server past its keep-alive count or timeout does.
  });
  HttpConnection c("127.0.0.1", peer.port());
  for (int i = 0; i < 4; ++i) {
    HttpConnection::Answer answer;
    std::string error;
    ASSERT_EQ(c.Exchange(kRequest, 1s, 2s, answer, error), HttpConnection::Failure::kNone)
        << i << ": " << error;
    EXPECT_EQ(answer.body, "{}");
    std::this_thread::sleep_for(50ms);  // the close reaches the client before the next call
  }
  EXPECT_EQ(peer.accepted(), 2);
}

TEST(HttpConnection, TellsNotConnectedFromSentButUnanswered) {
  HttpConnection::Answer answer;
  std::string error;
  {
    int port;
    {
      Peer gone([](int) {});
      port = gone.port();
    }
    HttpConnection c("127.0.0.1", port);
    EXPECT_EQ(c.Exchange(kRequest, 1s, 1s, answer, error), HttpConnection::Failure::kConnect);
  }
  struct Case {
    const char* name;
    std::string answer;  // sent after the request is read; then the peer closes
    bool wait;           // the peer waits past the read timeout instead of closing
  };
  for (const Case& k :
       {Case{"closed without an answer", "", false},
        Case{"closed mid-body", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", false},
        Case{"garbage", "SMTP ready\r\n\r\n", false}, Case{"no answer in time", "", true}}) {
    Peer peer([&](int fd) {
      ReadRequest(fd);
      if (!k.answer.empty()) Write(fd, k.answer);
      if (k.wait) std::this_thread::sleep_for(400ms);
    });
    HttpConnection c("127.0.0.1", peer.port());
    EXPECT_EQ(c.Exchange(kRequest, 1s, 200ms, answer, error), HttpConnection::Failure::kReceive)
        << k.name;
    EXPECT_FALSE(c.reusable()) << k.name;
  }
}

}  // namespace

namespace {

using idemsaga::steps::client::HttpConnection;
using namespace std::chrono_literals;

// Interim answers (1xx) are skipped, whether they come with the final one or apart; an answer
// that runs to the close is whole, and its connection is not kept.
TEST(HttpConnection, SkipsInterimAnswersAndReadsAnAnswerThatRunsToTheClose) {
  struct Case {
    const char* name;
    std::vector<std::string> writes;  // 100 ms apart
    int status;
    std::string body;
    bool reusable;
  };
  const std::string final_answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
  for (const Case& k :
       {Case{"103 then 200 together",
             {"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + final_answer},
             200,
             "{}",
             true},
        Case{"100 apart", {"HTTP/1.1 100 Continue\r\n\r\n", final_answer}, 200, "{}", true},
        Case{"to the close",
             {"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"x\":1}"},
             200,
             "{\"x\":1}",
             false}}) {
    Peer peer([&](int fd) {
      ReadRequest(fd);
      for (const auto& w : k.writes) {
        Write(fd, w);
        std::this_thread::sleep_for(100ms);
      }
      if (!k.reusable) ::shutdown(fd, SHUT_WR);
      char c;
      ::recv(fd, &c, 1, 0);
    });
    HttpConnection c("127.0.0.1", peer.port());
    HttpConnection::Answer answer;
    std::string error;
    ASSERT_EQ(c.Exchange(kRequest, 1s, 2s, answer, error), HttpConnection::Failure::kNone)
        << k.name << ": " << error;
    EXPECT_EQ(answer.status, k.status) << k.name;
    EXPECT_EQ(answer.body, k.body) << k.name;
    EXPECT_EQ(c.reusable(), k.reusable) << k.name;
  }
  for (const char* cut :
       {"HTTP/1.1 100 Continue\r\n\r\n", "HTTP/1.1 101 Switching Protocols\r\n\r\n"}) {
    Peer peer([&](int fd) {
      ReadRequest(fd);
      Write(fd, cut);
    });
    HttpConnection c("127.0.0.1", peer.port());
    HttpConnection::Answer answer;
    std::string error;
    EXPECT_EQ(c.Exchange(kRequest, 1s, 1s, answer, error), HttpConnection::Failure::kReceive)
        << cut;
  }
}

}  // namespace

namespace {

// The bulkhead: a participant that holds its calls gets at most max_in_flight of them; one
// past that is not sent at all (certainly not applied) and asks for a retry later, so a slow
// participant holds no more of the orchestrator than its share.
TEST(ParticipantClient, ACallPastTheBulkheadIsNotSentAndAsksForARetryLater) {
  std::atomic<int> requests{0};
  Peer peer([&](int fd) {
    for (;;) {
      if (ReadRequest(fd).empty()) return;
      ++requests;
      std::this_thread::sleep_for(400ms);  // a slow participant
      Write(fd, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}");
    }
  });
  idemsaga::steps::client::HttpParticipantClient client(
      {.base_url = "http://127.0.0.1:" + std::to_string(peer.port()),
       .service_token = "test-token",
       .max_in_flight = 1});
  auto context = [](const std::string& key) {
    idemsaga::steps::saga::StepContext ctx;
    ctx.tenant_id = "demo";
    ctx.derived_key = key;
    ctx.trace = idemsaga::steps::saga::TraceContext{std::string(32, 'a'), std::string(16, 'b')};
    ctx.deadline = std::chrono::steady_clock::now() + 5s;
    return ctx;
  };
  idemsaga::steps::saga::StepResult first;
  std::thread slow([&] { first = client.Post("/v1/charges", context("A-payment"), {}); });
  std::this_thread::sleep_for(100ms);
  auto busy = client.Post("/v1/charges", context("B-payment"), {});
  EXPECT_EQ(busy.outcome, Outcome::kRetryable);
  EXPECT_EQ(busy.retry_after, 1000ms);
  EXPECT_TRUE(busy.busy);  // so the runner parks the wait rather than sleep on a thread
  EXPECT_NE(busy.detail.find("in flight"), std::string::npos) << busy.detail;
  slow.join();
  EXPECT_EQ(first.outcome, Outcome::kSucceeded) << first.detail;
  EXPECT_FALSE(first.busy);
  EXPECT_EQ(requests.load(), 1);  // the refused call never reached the participant
  // Its slot is free again once the first call answered.
  EXPECT_EQ(client.Post("/v1/charges", context("C-payment"), {}).outcome, Outcome::kSucceeded);
  EXPECT_EQ(requests.load(), 2);
}

// No token is no default: a client without one would be refused by every participant.
TEST(ParticipantClient, AClientWithoutAServiceTokenIsRefusedAtConstruction) {
  EXPECT_THROW(idemsaga::steps::client::HttpParticipantClient({.base_url = "http://127.0.0.1:1"}),
               std::invalid_argument);
}

}  // namespace
