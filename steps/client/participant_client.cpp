#include "steps/client/participant_client.hpp"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "common/http/problem.hpp"
#include "common/idempotency_key.hpp"
#include "steps/client/http_connection.hpp"

namespace idemsaga::steps::client {

using protocol::GuardCode;
namespace {

using namespace std::string_view_literals;

// A header value as sent: one with CR, LF or NUL would end the header early (or smuggle one
// in). Every value here is checked where it enters (keys, tenants, configuration); this is the
// last line, and what trips it is never sent.
bool SafeHeaderValue(std::string_view v) { return v.find_first_of("\r\n\0"sv) == v.npos; }

// A request target as sent: visible ASCII only (a space would end it).
bool SafeTarget(std::string_view path) {
  return !path.empty() && std::all_of(path.begin(), path.end(),
                                      [](unsigned char c) { return c > 0x20 && c < 0x7f; });
}

// The whole request in one piece: one write, one segment.
std::string Request(std::string_view method, std::string_view path, const std::string& authority,
                    std::initializer_list<std::pair<std::string_view, std::string_view>> headers,
                    std::string_view body) {
  std::string out;
  out.reserve(256 + body.size());
  out.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: ").append(authority);
  for (const auto& [name, value] : headers) {
    out.append("\r\n").append(name).append(": ").append(value);
  }
  if (method == "POST") {
    out.append("\r\nContent-Type: application/json\r\nContent-Length: ")
        .append(std::to_string(body.size()));
  }
  out.append("\r\n\r\n").append(body);
  return out;
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
  if ((x.status == 409 && code == ToString(GuardCode::kInProgress)) || x.status == 429 ||
      x.status >= 500) {
    auto retry = StepResult::Retryable(status_text, x.status);
    retry.retry_after = RetryAfter(x.retry_after);
    return retry;
  }
  if (x.status >= 400 && x.status < 500 &&
      (business_errors.count(code) > 0 || kGuardRefusals.count(code) > 0)) {
    return StepResult::Terminal(x.status, code, message.empty() ? status_text : message);
  }
  if (x.status == 422 && code == ToString(GuardCode::kKeyReused)) {
    // The participant keeps the first request under this key: this one differs. After a
    // crash, a takeover or a park every step is re-sent, so a step whose request is not a
    // pure function of the input and earlier outputs (a timestamp, a fresh id) lands here.
    auto changed = StepResult::Blocked(
        x.status, status_text +
                      " (step_request_changed): this step's request differs from the one first "
                      "sent under its key; a step's request must be a pure function of the "
                      "saga's input and earlier outputs (no clock, no fresh ids), because every "
                      "step is re-sent after a crash. Fix the step, then retry the saga");
    changed.error_code = "step_request_changed";
    return changed;
  }
  return StepResult::Blocked(x.status, status_text + (message.empty() ? "" : ": " + message));
}

saga::StepResult Interpret(const HttpExchange& x, const saga::StepContext& ctx,
                           const std::set<std::string>& business_errors, const std::string& where) {
  if (x.transport != HttpExchange::Transport::kAnswered) return MapOutcome(x);
  auto result = MapOutcome(x, business_errors);
  if (result.outcome == saga::Outcome::kBlocked) {
    result.detail = "participant " + where + " answered " + result.detail;
  }
  // A compensation for an action that certainly happened, answered "never arrived": the
  // participant has lost the action's record (expired, restored from backup), so nothing
  // was undone. Saying "compensated" would leave the customer charged.
  if (ctx.action_confirmed && result.outcome == saga::Outcome::kSucceeded &&
      result.output.is_object() &&
      result.output.value("outcome", "") == ToString(protocol::Outcome::kCancelled)) {
    return saga::StepResult::Blocked(
        x.status, "the participant has no record of the applied action " + ctx.action_key +
                      " (expired?); nothing was undone");
  }
  return result;
}

bool HttpParticipantClient::EnterBulkhead() {
  auto give_up = std::chrono::steady_clock::now() + options_.busy_wait;
  size_t n = in_flight_.load();
  for (;;) {
    while (n < options_.max_in_flight) {
      if (in_flight_.compare_exchange_weak(n, n + 1)) return true;
    }
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    n = in_flight_.load();
  }
}

HttpParticipantClient::HttpParticipantClient(Options options) : options_(std::move(options)) {
  if (options_.service_token.empty()) {
    throw std::invalid_argument("participant client for " + options_.base_url +
                                ": no service token");
  }
  std::tie(host_, port_) = ParseHttpBaseUrl(options_.base_url);
  authority_ = host_ + ":" + std::to_string(port_);
}

HttpParticipantClient::~HttpParticipantClient() = default;

std::unique_ptr<HttpConnection> HttpParticipantClient::Acquire() {
  {
    std::lock_guard lock(mutex_);
    auto now = std::chrono::steady_clock::now();
    while (!idle_.empty()) {
      auto idle = std::move(idle_.back());
      idle_.pop_back();
      if (now - idle.since <= options_.max_idle_age) return std::move(idle.connection);
    }
  }
  return std::make_unique<HttpConnection>(host_, port_);
}

void HttpParticipantClient::Release(std::unique_ptr<HttpConnection> connection) {
  if (!connection->reusable()) return;
  std::lock_guard lock(mutex_);
  if (idle_.size() < options_.max_idle_connections) {
    idle_.push_back({std::move(connection), std::chrono::steady_clock::now()});
  }
}

HttpExchange HttpParticipantClient::Send(const std::string& request,
                                         std::chrono::milliseconds read_timeout) {
  auto connection = Acquire();
  HttpConnection::Answer answer;
  HttpExchange x;
  switch (connection->Exchange(request, options_.connect_timeout, read_timeout, answer, x.error)) {
    case HttpConnection::Failure::kConnect:
      x.transport = HttpExchange::Transport::kNotConnected;
      return x;
    case HttpConnection::Failure::kSend:
    case HttpConnection::Failure::kReceive:
      x.transport = HttpExchange::Transport::kNoAnswer;  // it may have arrived
      return x;
    case HttpConnection::Failure::kNone:
      break;
  }
  Release(std::move(connection));
  x.status = answer.status;
  x.body = std::move(answer.body);
  x.replayed = answer.replayed == "true";
  x.retry_after = std::move(answer.retry_after);
  return x;
}

saga::StepResult HttpParticipantClient::Post(const std::string& path, const saga::StepContext& ctx,
                                             const nlohmann::json& body) {
  // Never wait past the step's deadline, but give a call at least 100 ms.
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      ctx.deadline - std::chrono::steady_clock::now());
  auto limit = ctx.call_timeout.count() > 0 ? std::min(ctx.call_timeout, options_.read_timeout)
                                            : options_.read_timeout;
  auto read_timeout = std::clamp(left, std::chrono::milliseconds(100),
                                 std::max(limit, std::chrono::milliseconds(100)));
  const std::string token = "Bearer " + options_.service_token;
  const std::string key = common::FormatIdempotencyKey(ctx.derived_key);
  const std::string traceparent = ctx.trace.Traceparent();
  HttpExchange x;
  if (!SafeHeaderValue(token) || !SafeHeaderValue(ctx.tenant_id) || !SafeHeaderValue(key) ||
      !SafeHeaderValue(traceparent) || !SafeTarget(path)) {
    x.transport = HttpExchange::Transport::kNotConnected;
    x.error =
        "a header value with CR, LF or NUL, or a path with a space or control character, was not "
        "sent";
    return MapOutcome(x);
  }
  // The bulkhead: refused before anything is sent, so certainly not applied.
  if (options_.max_in_flight > 0 && !EnterBulkhead()) {
    auto busy =
        saga::StepResult::Retryable("not sent: " + std::to_string(options_.max_in_flight) +
                                    " calls to " + options_.base_url + " are in flight already");
    busy.retry_after = options_.busy_retry_after;
    busy.busy = true;
    return busy;
  }
  struct Leave {
    std::atomic<size_t>& n;
    bool counted;
    ~Leave() {
      if (counted) n.fetch_sub(1);
    }
  } leave{in_flight_, options_.max_in_flight > 0};
  x = Send(Request("POST", path, authority_,
                   {{"Authorization", token},
                    {"X-Tenant-ID", ctx.tenant_id},
                    {"Idempotency-Key", key},
                    {"traceparent", traceparent}},
                   body.dump()),
           read_timeout);
  return Interpret(x, ctx, options_.business_errors, options_.base_url + path);
}

saga::StepResult HttpParticipantClient::Compensate(const std::string& path,
                                                   const saga::StepContext& ctx) {
  // action_applied: the participant must not take a missing record for "never arrived".
  return Post(path, ctx,
              {{"action_key", ctx.action_key}, {"action_applied", ctx.action_confirmed}});
}

std::optional<nlohmann::json> HttpParticipantClient::GetJson(const std::string& path,
                                                             std::string& error, int& status) {
  status = 0;
  const std::string token = "Bearer " + options_.service_token;
  if (!SafeHeaderValue(token) || !SafeTarget(path)) {
    error =
        "a header value with CR, LF or NUL, or a path with a space or control character, was not "
        "sent";
    return std::nullopt;
  }
  auto x =
      Send(Request("GET", path, authority_, {{"Authorization", token}}, ""), options_.read_timeout);
  if (x.transport != HttpExchange::Transport::kAnswered) {
    error = x.error;
    return std::nullopt;
  }
  status = x.status;
  auto body = nlohmann::json::parse(x.body, nullptr, false);
  if (x.status != 200 || body.is_discarded()) {
    error = "HTTP " + std::to_string(x.status);
    return std::nullopt;
  }
  return body;
}

}  // namespace idemsaga::steps::client
