// The orchestrator's HTTP client for participant steps: sends the derived key, the tenant,
// the service token and `traceparent`, with explicit timeouts, over kept-alive connections,
// and maps every answer (or its absence) to a saga::StepResult in one place (MapOutcome).
//
// Thread-safe: each call borrows its own connection from a small free list.
//   ParticipantClient inventory({.base_url = "http://127.0.0.1:8081", .service_token = t});
//   saga::StepResult r = inventory.Post("/v1/reservations", ctx, body);
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "orchestrator/saga/step.hpp"

namespace httplib {
class Client;
}

namespace steps::client {

// What came back from one HTTP exchange, before interpretation.
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
  std::string error;  // transport error text
};

// The one table from the wire to what the runner does next:
//   not connected -> retryable; no answer after sending -> in doubt;
//   2xx -> succeeded; 409 idempotency_key_in_progress, 429, 5xx -> retryable;
//   other 4xx (declined, out of stock, cancelled, ...) -> terminal.
saga::StepResult MapOutcome(const HttpExchange& exchange);

class ParticipantClient {
 public:
  struct Options {
    std::string base_url;  // http://host:port
    std::string service_token = "dev-service-token";
    // cpp-httplib's default connect timeout is 300 s; a participant on loopback or in the
    // same zone connects in well under a second.
    std::chrono::milliseconds connect_timeout{1000};
    // Longer than a participant's slowest healthy answer (its lock timeout is 3 s).
    std::chrono::milliseconds read_timeout{5000};
    size_t max_idle_connections = 64;
  };

  explicit ParticipantClient(Options options);
  ~ParticipantClient();

  // POSTs `body` to `path` under the context's derived key.
  saga::StepResult Post(const std::string& path, const saga::StepContext& ctx,
                        const nlohmann::json& body);

  const Options& options() const { return options_; }

 private:
  std::unique_ptr<httplib::Client> Acquire();
  void Release(std::unique_ptr<httplib::Client> client);

  Options options_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<httplib::Client>> idle_;
};

}  // namespace steps::client
