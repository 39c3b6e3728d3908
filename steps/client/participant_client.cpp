#include "steps/client/participant_client.hpp"

#include <httplib.h>

#include <algorithm>

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

std::pair<std::string, std::string> ErrorOf(const nlohmann::json& body) {
  if (body.is_object() && body.contains("error") && body["error"].is_object()) {
    return {body["error"].value("code", ""), body["error"].value("message", "")};
  }
  return {"", ""};
}

}  // namespace

saga::StepResult MapOutcome(const HttpExchange& x) {
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
  auto [code, message] = ErrorOf(body);
  if ((x.status == 409 && code == "idempotency_key_in_progress") || x.status == 429 ||
      x.status >= 500) {
    return StepResult::Retryable("HTTP " + std::to_string(x.status) + " " + code, x.status);
  }
  if (x.status >= 400) {
    return StepResult::Terminal(x.status, code.empty() ? "step_refused" : code,
                                message.empty() ? "HTTP " + std::to_string(x.status) : message);
  }
  return StepResult::Terminal(x.status, "unexpected_status",
                              "unexpected HTTP " + std::to_string(x.status));
}

ParticipantClient::ParticipantClient(Options options) : options_(std::move(options)) {}

ParticipantClient::~ParticipantClient() = default;

std::unique_ptr<httplib::Client> ParticipantClient::Acquire() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
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
  if (idle_.size() < options_.max_idle_connections) idle_.push_back(std::move(client));
}

saga::StepResult ParticipantClient::Post(const std::string& path, const saga::StepContext& ctx,
                                         const nlohmann::json& body) {
  auto client = Acquire();
  // Never wait past the step's deadline, but give a call at least 100 ms.
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      ctx.deadline - std::chrono::steady_clock::now());
  auto read_timeout = std::clamp(left, std::chrono::milliseconds(100), options_.read_timeout);
  client->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(read_timeout));
  httplib::Headers headers = {{"Authorization", "Bearer " + options_.service_token},
                              {"X-Tenant-ID", ctx.tenant_id},
                              {"Idempotency-Key", ctx.derived_key},
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
  Release(std::move(client));
  return MapOutcome(x);
}

}  // namespace steps::client
