// The orchestrator's HTTP client for participant steps: sends the derived key, the tenant,
// the service token and `traceparent`, with explicit timeouts, over kept-alive connections,
// and maps every answer (or its absence) to a saga::StepResult in one place (MapOutcome).
//
// Thread-safe: each call borrows its own connection from a small free list.
//   HttpParticipantClient inventory({.base_url = "http://127.0.0.1:8081", .service_token = t});
//   saga::StepResult r = inventory.Post("/v1/reservations", ctx, body);
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "steps/protocol/participant_protocol.hpp"
#include "steps/saga/step.hpp"

namespace idemsaga::steps::client {

class HttpConnection;

// What came back from one HTTP exchange, before interpretation: an answer, or what the
// transport did instead (not sent, or no answer), which decides whether a step may have been
// applied. Not a common::http::Answer: it has a transport outcome and no headers but two.
struct HttpExchange {
  enum class Transport {
    kAnswered,      // a complete response was read
    kNotConnected,  // the connection was never made: the request was certainly not sent
    kNoAnswer,      // sent (or partly sent), then timeout or drop: it may have been applied
  };
  Transport transport = Transport::kAnswered;
  int status = 0;
  std::string body;
  bool replayed = false;
  std::string error;        // transport error text
  std::string retry_after;  // the Retry-After header, as sent
};

// Error codes every guard answers with that are definite "not applied" answers: the action's
// compensation arrived first (tombstone) or already undid it.
inline const std::set<std::string> kGuardRefusals = {
    protocol::ToString(protocol::GuardCode::kCancelled),
    protocol::ToString(protocol::GuardCode::kCompensated)};

// The one table from the wire to what the runner does next:
//   not connected -> retryable; no answer after sending -> in doubt;
//   2xx -> succeeded; 409 idempotency_key_in_progress, 429, 5xx -> retryable (Retry-After
//   honoured); a 4xx whose error code the participant declares as a business refusal
//   (`business_errors`, e.g. card_declined) or a guard refusal -> terminal; any other 4xx
//   (401 wrong token, 404 wrong URL, 400/405/413/415/422 protocol errors) -> blocked: a
//   configuration fault that must not become the customer's answer.
saga::StepResult MapOutcome(const HttpExchange& exchange,
                            const std::set<std::string>& business_errors = {});

// A participant's answer to a step's call, whatever carried it (HTTP, or a reply from a queue):
// MapOutcome, with `where` (the participant's URL and path, or its queue) in a blocked step's
// detail, and a compensation of a confirmed action answered "never arrived" blocked (the
// participant lost the action's record: nothing was undone).
saga::StepResult Interpret(const HttpExchange& exchange, const saga::StepContext& ctx,
                           const std::set<std::string>& business_errors, const std::string& where);

class HttpParticipantClient final : public idemsaga::ParticipantClient {
 public:
  struct Options {
    std::string base_url;  // http://host:port
    // Required (the constructor throws std::invalid_argument without it): a participant
    // refuses a call without its token, and no token is a safe default.
    std::string service_token;
    // cpp-httplib's default connect timeout is 300 s; a participant on loopback or in the
    // same zone connects in well under a second.
    std::chrono::milliseconds connect_timeout{1000};
    // Longer than a participant's slowest healthy answer (its lock timeout is 3 s).
    std::chrono::milliseconds read_timeout{5000};
    size_t max_idle_connections = 64;
    // An idle connection older than this is closed, not reused: the participant may have
    // closed it (its keep-alive timeout is 1-2 s), and a request sent on a socket the peer
    // just closed fails after sending, which would count as "in doubt" for no reason. Waits
    // before a retry (backoff, Retry-After) are often this long.
    std::chrono::milliseconds max_idle_age{500};
    // The participant's business refusals: the only 4xx codes that fail a saga for good.
    std::set<std::string> business_errors;
    // A bulkhead: at most this many calls in flight to this participant. A call past it is
    // not sent; the step is retried after `busy_retry_after` (a wait the runner parks for,
    // holding no thread), so a slow participant delays only the sagas that call it. 0: none.
    size_t max_in_flight = 64;
    std::chrono::milliseconds busy_retry_after{1000};
    // How long a call waits for a slot before it is turned away: a healthy participant frees
    // one within milliseconds, so only a slow one turns calls away.
    std::chrono::milliseconds busy_wait{20};
  };

  explicit HttpParticipantClient(Options options);
  ~HttpParticipantClient();

  // POSTs `body` to `path` under the context's derived key.
  saga::StepResult Post(const std::string& path, const saga::StepContext& ctx,
                        const nlohmann::json& body) override;

  // POSTs the compensation of the context's action to `path`: {"action_key", "action_applied"},
  // what every guarded compensation route takes (steps/guard).
  saga::StepResult Compensate(const std::string& path, const saga::StepContext& ctx) override;

  // GETs `path` with the service token: the JSON body of a 200, else nullopt with `error`;
  // `status` is the HTTP status, 0 when no answer came.
  std::optional<nlohmann::json> GetJson(const std::string& path, std::string& error, int& status);

  const std::string& base_url() const { return options_.base_url; }

 private:
  std::unique_ptr<HttpConnection> Acquire();
  void Release(std::unique_ptr<HttpConnection> connection);
  // One request and its answer on a borrowed connection, mapped to what came back.
  HttpExchange Send(const std::string& request, std::chrono::milliseconds read_timeout);

  Options options_;
  std::string host_;
  int port_;
  std::string authority_;  // host:port, the Host header
  std::mutex mutex_;
  struct Idle {
    std::unique_ptr<HttpConnection> connection;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Idle> idle_;  // most recently used last
  std::atomic<size_t> in_flight_{0};
  // Takes a bulkhead slot, waiting up to Options::busy_wait; false when none came free.
  bool EnterBulkhead();
};

}  // namespace idemsaga::steps::client
