#include "steps/client/participant_client.hpp"

#include <httplib.h>

#include <algorithm>

#include "common/http/problem.hpp"
#include "common/idempotency_key.hpp"

namespace steps::client {
namespace {

bool NeverSent(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
    case httplib::Error::ConnectionTimeout:
    case httplib::Error::BindIPAddress:
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return true;
    default:
      return false;  // Read, Write, Canceled, Unknown, ...: the request may have arrived
  }
}

// Retry-After as delay-seconds (RFC 9110 §10.2.3); an HTTP-date or garbage counts as absent.
// Capped: a participant cannot park a saga for longer than a minute per attempt.
std::chrono::milliseconds RetryAfter(const std::string& value) {
  if (value.empty() || value.size() > 6 || value.find_first_not_of("0123456789") != value.npos) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::seconds(std::min(std::stol(value), 60L));
}

}  // namespace

saga::StepResult MapOutcome(const HttpExchange& x, const std::set<std::string>& business_errors) {
  using saga::StepResult;
  switch (x.transport) {
    case HttpExchange::Transport::kNotConnected:
      return StepResult::Retryable("could not connect: " + x.error);
    case HttpExchange::Transport::kNoAnswer:
      return StepResult::InDoubt("sent, no answer: " + x.error);
    case HttpExchange::Transport::kAnswered:
      break;
  }
  auto body = nlohmann::json::parse(x.body, nullptr, false);
  if (x.status >= 200 && x.status < 300) {
    if (body.is_discarded()) return StepResult::InDoubt("2xx with a body that is not JSON");
    auto ok = StepResult::Succeeded(std::move(body), x.replayed);
    ok.http_status = x.status;
    return ok;
  }
  auto [code, message] = common::http::ErrorOf(body);
  std::string status_text = "HTTP " + std::to_string(x.status);
  if (!code.empty()) status_text += " " + code;
  if ((x.status == 409 && code == "idempotency_key_in_progress") || x.status == 429 ||
      x.status >= 500) {
    auto retry = StepResult::Retryable(status_text, x.status);
    retry.retry_after = RetryAfter(x.retry_after);
    return retry;
  }
  if (x.status >= 400 && x.status < 500 &&
      (business_errors.count(code) > 0 || kGuardRefusals.count(code) > 0)) {
    return StepResult::Terminal(x.status, code, message.empty() ? status_text : message);
  }
  return StepResult::Blocked(x.status, status_text + (message.empty() ? "" : ": " + message));
}

ParticipantClient::ParticipantClient(Options options) : options_(std::move(options)) {}

ParticipantClient::~ParticipantClient() = default;

std::unique_ptr<httplib::Client> ParticipantClient::Acquire() {
  {
    std::lock_guard lock(mutex_);
    auto now = std::chrono::steady_clock::now();
    while (!idle_.empty()) {
      auto idle = std::move(idle_.back());
      idle_.pop_back();
      if (now - idle.since <= options_.max_idle_age) return std::move(idle.client);
    }
  }
  auto c = std::make_unique<httplib::Client>(options_.base_url);
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);
  c->set_connection_timeout(
      std::chrono::duration_cast<std::chrono::microseconds>(options_.connect_timeout));
  return c;
}

void ParticipantClient::Release(std::unique_ptr<httplib::Client> client) {
  std::lock_guard lock(mutex_);
  if (idle_.size() < options_.max_idle_connections) {
    idle_.push_back({std::move(client), std::chrono::steady_clock::now()});
  }
}

saga::StepResult ParticipantClient::Post(const std::string& path, const saga::StepContext& ctx,
                                         const nlohmann::json& body) {
  auto client = Acquire();
  // Never wait past the step's deadline, but give a call at least 100 ms.
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      ctx.deadline - std::chrono::steady_clock::now());
  auto limit = ctx.call_timeout.count() > 0 ? std::min(ctx.call_timeout, options_.read_timeout)
                                            : options_.read_timeout;
  auto read_timeout = std::clamp(left, std::chrono::milliseconds(100),
                                 std::max(limit, std::chrono::milliseconds(100)));
  client->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(read_timeout));
  httplib::Headers headers = {{"Authorization", "Bearer " + options_.service_token},
                              {"X-Tenant-ID", ctx.tenant_id},
                              {"Idempotency-Key", common::FormatIdempotencyKey(ctx.derived_key)},
                              {"traceparent", ctx.trace.Traceparent()}};
  auto res = client->Post(path.c_str(), headers, body.dump(), "application/json");
  HttpExchange x;
  if (!res) {
    x.transport = NeverSent(res.error()) ? HttpExchange::Transport::kNotConnected
                                         : HttpExchange::Transport::kNoAnswer;
    x.error = httplib::to_string(res.error());
    return MapOutcome(x);  // the connection is in an unknown state: do not reuse it
  }
  x.status = res->status;
  x.body = res->body;
  x.replayed = res->get_header_value("Idempotent-Replayed") == "true";
  x.retry_after = res->get_header_value("Retry-After");
  Release(std::move(client));
  auto result = MapOutcome(x, options_.business_errors);
  if (result.outcome == saga::Outcome::kBlocked) {
    result.detail = "participant " + options_.base_url + path + " answered " + result.detail;
  }
  // A compensation for an action that certainly happened, answered "never arrived": the
  // participant has lost the action's record (expired, restored from backup), so nothing
  // was undone. Saying "compensated" would leave the customer charged.
  if (ctx.action_confirmed && result.outcome == saga::Outcome::kSucceeded &&
      result.output.is_object() && result.output.value("outcome", "") == "cancelled") {
    return saga::StepResult::Blocked(
        x.status, "the participant has no record of the applied action " + ctx.action_key +
                      " (expired?); nothing was undone");
  }
  return result;
}

saga::StepResult ParticipantClient::Compensate(const std::string& path,
                                               const saga::StepContext& ctx) {
  // action_applied: the participant must not take a missing record for "never arrived".
  return Post(path, ctx,
              {{"action_key", ctx.action_key}, {"action_applied", ctx.action_confirmed}});
}

std::optional<nlohmann::json> ParticipantClient::GetJson(const std::string& path,
                                                         std::string& error, int& status) {
  status = 0;
  auto client = Acquire();
  client->set_read_timeout(
      std::chrono::duration_cast<std::chrono::microseconds>(options_.read_timeout));
  auto res = client->Get(path.c_str(), {{"Authorization", "Bearer " + options_.service_token}});
  if (!res) {
    error = httplib::to_string(res.error());
    return std::nullopt;
  }
  Release(std::move(client));
  status = res->status;
  auto body = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200 || body.is_discarded()) {
    error = "HTTP " + std::to_string(res->status);
    return std::nullopt;
  }
  return body;
}

}  // namespace steps::client
