#include "steps/guard/queue_commands.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include "common/http/problem.hpp"
#include "common/http/wire.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"
#include "steps/protocol/participant_protocol.hpp"

namespace idemsaga::steps::guard {
namespace {

using common::IEquals;
using common::amqp::Connection;
using common::amqp::Delivery;
using common::amqp::Message;

// The problem codes the edge refuses a request with before the guard stores anything
// (HttpGuard::Admit, the validate step, the router), and the guard's own refusal of a reused
// key: a message answered so is dead-lettered.
const std::set<std::string, std::less<>> kRefusedCodes = {
    "not_found",
    "unauthorized",
    "idempotency_key_missing",
    "idempotency_key_invalid",
    "invalid_json",
    "unsupported_media_type",
    "payload_too_large",
    "invalid_request",
    "method_not_allowed",
    protocol::ToString(protocol::GuardCode::kKeyReused)};

// A route path as a command names it: `/` and then unreserved characters and `/` only (no
// query, no escapes), so the route sees the path a client would send for it.
bool IsCommandPath(const std::string& path) {
  return !path.empty() && path.size() <= 1024 && path[0] == '/' &&
         std::all_of(path.begin(), path.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '-' || c == '.' ||
                  c == '_' || c == '~';
         });
}

// The route path of `m`, or "" after setting the refusal on `res`: one non-empty string header
// `path` of the plain form above.
std::string CommandPath(const Message& m, httplib::Response& res) {
  auto path = common::amqp::OneHeader(m, "path");
  if (path && IsCommandPath(*path)) return *path;
  common::http::SetError(res, 400, "invalid_request",
                         !common::amqp::Named(m, "path")
                             ? "a command names its route in the header `path` (e.g. /v1/shipments)"
                             : "the header `path` must be one string: / and then [A-Za-z0-9/._~-]");
  return "";
}

// The POST a command stands for: its headers as the request's (`path` aside; the message's
// content_type, or application/json, as Content-Type), its body. A header that is not a string
// becomes a value no check accepts (a DEL byte), so it is refused as a malformed one.
httplib::Request AsRequest(const Message& m, const std::string& path) {
  httplib::Request req;
  req.method = "POST";
  req.target = path;
  req.path = path;
  for (const auto& [name, value] : m.headers) {
    if (IEquals(name, "path") || IEquals(name, "Content-Type") || IEquals(name, "Content-Length")) {
      continue;
    }
    req.headers.emplace(name, value);
  }
  for (const auto& [name, kind] : m.other_headers) {
    if (!IEquals(name, "path")) req.headers.emplace(name, "\x7f");
  }
  req.headers.emplace("Content-Type",
                      m.content_type.empty() ? std::string("application/json") : m.content_type);
  req.body = m.body;
  return req;
}

// What the server would send of `res`, as a reply's parts: its framing and markers aside.
common::amqp::ReplyParts Parts(const httplib::Response& res) {
  common::amqp::ReplyParts parts{res.status, res.get_header_value("Content-Type"), {}, res.body};
  for (const auto& [name, value] : res.headers) {
    if (IEquals(name, "Content-Type") || IEquals(name, "Content-Length") ||
        IEquals(name, "Transfer-Encoding") || IEquals(name, "Connection") ||
        IEquals(name, common::http::detail::kDeferMarker)) {
      continue;
    }
    parts.headers.emplace(name, value);
  }
  return parts;
}

}  // namespace

std::optional<common::amqp::QueueType> ParseQueueType(const std::string& name) {
  if (IEquals(name, "classic")) return common::amqp::QueueType::kClassic;
  if (IEquals(name, "quorum")) return common::amqp::QueueType::kQuorum;
  return std::nullopt;
}

QueueCommands::QueueCommands(QueueCommandsOptions options, Routes routes,
                             common::metrics::Registry* metrics)
    : options_(std::move(options)), routes_(std::move(routes)) {
  if (metrics != nullptr) {
    messages_ = &metrics->Counter(
        "idemsaga_amqp_commands_total",
        "Command messages taken from the participant's queue, by what became of them: replied "
        "(answer published, acked), dead_lettered, requeued (stopping, or asked to come back "
        "for longer than --amqp-max-wait-ms); redelivered counts deliveries the broker had "
        "handed out before.",
        {"queue", "outcome"});
    for (const char* outcome : {"replied", "dead_lettered", "requeued", "redelivered"}) {
      messages_->With({options_.queue, outcome});
    }
  }
  consumers_.emplace(
      common::amqp::ConsumersOptions{.urls = options_.urls,
                                     .queue = options_.queue,
                                     .queue_type = options_.queue_type,
                                     .consumers = options_.consumers,
                                     .log_name = "amqp_commands"},
      [this](Connection& conn, const Delivery& d) { Handle(conn, d); }, metrics);
}

QueueCommands::~QueueCommands() { Stop(); }

void QueueCommands::Start() {
  consumers_->Start();
  common::Log("amqp_commands_started",
              {{"queue", options_.queue}, {"consumers", std::to_string(options_.consumers)}});
}

void QueueCommands::Stop() { consumers_->Stop(); }

void QueueCommands::Count(const char* outcome) {
  if (messages_ != nullptr) messages_->With({options_.queue, outcome}).Inc();
}

void QueueCommands::Handle(Connection& conn, const Delivery& d) {
  if (d.redelivered) Count("redelivered");
  const Message& m = d.message;
  auto deadline = std::chrono::steady_clock::now() + options_.max_wait;
  auto wait = std::chrono::milliseconds(100);
  for (;;) {
    httplib::Response res;
    bool outage = false;
    if (auto path = CommandPath(m, res); !path.empty()) {
      auto route = routes_.find(path);
      if (route == routes_.end()) {
        common::http::SetError(res, 404, "not_found", "no such resource");  // the router's
      } else {
        try {
          route->second(AsRequest(m, path), res);
          if (res.status == -1) res.status = 200;
        } catch (...) {
          // The server's exception policy: an outage is asked about again, anything else
          // fails the same way every time and is answered 500.
          auto failure = options_.classify ? options_.classify(std::current_exception())
                                           : common::ClassifyPlain(std::current_exception());
          outage = failure.kind == common::Failure::kUnavailable;
          res = httplib::Response();
          common::http::SetAnswer(res, common::http::FailureAnswer(failure));
        }
      }
    }
    if (res.has_header(common::http::detail::kCloseMarker)) {
      // The route dropped its answer after its commit: as a crash would, the connection goes
      // and the broker redelivers, to a replay.
      throw common::amqp::AmqpError("the route at " + common::amqp::First(m, "path") +
                                    " dropped its answer");
    }
    const bool replayed = res.get_header_value("Idempotent-Replayed") == "true";
    if (outage || (!replayed && res.has_header("Retry-After"))) {
      // Come back later (an outage, a duplicate in flight): asked again with the message in
      // hand, since a requeue counts against a quorum queue's delivery-limit.
      if (consumers_->stopping() || std::chrono::steady_clock::now() + wait > deadline) {
        conn.Reject(d.tag, true);
        Count("requeued");
        return;
      }
      conn.Idle(wait);
      wait = std::min(wait * 2, std::chrono::milliseconds(2000));
      continue;
    }
    auto [code, detail] = common::http::ErrorOf(nlohmann::json::parse(res.body, nullptr, false));
    const bool refused =
        !replayed && (res.status == 500 ||
                      (res.status >= 400 && res.status < 500 && kRefusedCodes.count(code) != 0));
    if (refused) {
      // Mandatory: a dead-letter queue deleted meanwhile fails the publish (the message is
      // then redelivered and the queue declared again), never loses the message.
      conn.Publish(options_.queue + ".dead", common::amqp::DeadLetter(m, res.status, code, detail),
                   true);
    }
    if (!m.reply_to.empty()) conn.Publish(m.reply_to, common::amqp::Reply(m, Parts(res)));
    conn.Ack(d.tag);
    if (refused) {
      common::Log("amqp_command_dead_lettered", {{"queue", options_.queue},
                                                 {"status", std::to_string(res.status)},
                                                 {"error", code},
                                                 {"message_id", m.message_id}});
    }
    Count(refused ? "dead_lettered" : "replied");
    return;
  }
}

}  // namespace idemsaga::steps::guard
