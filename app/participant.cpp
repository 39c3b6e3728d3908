// idemsaga::Participant (include/idemsaga/participant.hpp) over the guard (steps/guard) and
// the HTTP server, and its binary's command line (Run): the public types are copied to and from the
// guard's at the edge, so the guard's own may grow without a user seeing it.
#include "idemsaga/participant.hpp"

#include <CLI/CLI.hpp>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "app/signals.hpp"
#include "common/http/server.hpp"
#include "common/metrics.hpp"
#include "common/net.hpp"
#include "common/pg/errors.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/pool.hpp"
#include "common/pg/url.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"
#include "steps/saga/step.hpp"

namespace idemsaga {
namespace {

namespace guard = steps::guard;

Request Public(const guard::Request& r) { return {r.tenant_id, r.key, r.body}; }

ActionRecord Public(const guard::ActionRecord& a) { return {a.key, a.status, a.body}; }

guard::Response Internal(Response r) {
  guard::Response out;
  out.status = r.status;
  out.body = std::move(r.body);
  out.headers = std::move(r.headers);
  return out;
}

}  // namespace

Response Problem(int status, const std::string& code, const std::string& detail) {
  auto p = guard::Problem(status, code, detail);
  Response out{p.status, p.body, p.headers};
  out.headers["Content-Type"] = p.content_type;
  return out;
}

struct Participant::Impl {
  ParticipantServiceOptions options;
  std::vector<std::string> schema;
  // Routes are added when the service starts: the database URL may come from the flags.
  std::vector<std::function<void(Impl&)>> routes;

  struct Serving {
    explicit Serving(const ParticipantServiceOptions& o)
        : pool({.url = o.database_url, .size = o.pool_size}),
          guard(pool, nullptr, {.retention = o.retention}),
          http(guard, {.service_token = o.service_token, .metrics = &metrics, .service = o.name}),
          server(common::http::Limits{.threads = o.threads}, common::pg::Classify) {}
    common::metrics::Registry metrics;
    common::pg::Pool pool;
    guard::Guard guard;
    guard::HttpGuard http;
    common::http::Server server;
    std::string host;
    int port = 0;
    std::thread thread;
  };
  std::unique_ptr<Serving> serving;
};

Participant::Participant(ParticipantServiceOptions options) : impl_(std::make_unique<Impl>()) {
  if (!IsValidStepName(options.name)) {
    throw std::invalid_argument("a participant's name is 1..32 of [a-z0-9_]: " + options.name);
  }
  impl_->options = std::move(options);
}

Participant::~Participant() { Stop(); }

Participant& Participant::Schema(std::string sql) {
  impl_->schema.push_back(std::move(sql));
  return *this;
}

Participant& Participant::Action(const std::string& path, Validate validate, Effect effect) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->server.Post(
        path, i.serving->http.Action(validate, [effect](pqxx::work& tx, const guard::Request& req) {
          return Internal(effect(tx, Public(req)));
        }));
  });
  return *this;
}

Participant& Participant::Compensation(const std::string& path, Undo undo) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->server.Post(
        path, i.serving->http.Compensation([undo](pqxx::work& tx, const guard::Request& req,
                                                  const guard::ActionRecord& action) {
          return undo(tx, Public(req), Public(action));
        }));
  });
  return *this;
}

Participant& Participant::ExternalAction(const std::string& path, Validate validate,
                                         ExternalEffect effect) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->server.Post(
        path, i.serving->http.ExternalAction(validate, [effect](const guard::ExternalCall& call) {
          Request request = Public(call.request);
          return Internal(effect(ExternalCall{request, call.earlier_attempt, call.deadline}));
        }));
  });
  return *this;
}

Participant& Participant::ExternalCompensation(const std::string& path, ExternalUndo undo) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->server.Post(
        path, i.serving->http.ExternalCompensation([undo](const guard::ExternalCall& call,
                                                          const guard::ActionRecord& action) {
          Request request = Public(call.request);
          return undo(ExternalCall{request, call.earlier_attempt, call.deadline}, Public(action));
        }));
  });
  return *this;
}

int Participant::Start(const std::string& host, int port) {
  auto& i = *impl_;
  if (i.serving) throw std::logic_error("participant " + i.options.name + ": started already");
  if (i.options.database_url.empty()) {
    throw std::invalid_argument("participant " + i.options.name + ": no database URL");
  }
  if (i.options.service_token.empty()) {
    throw std::invalid_argument("participant " + i.options.name + ": no service token");
  }
  {
    pqxx::connection conn(common::pg::WithSessionTimeouts(i.options.database_url));
    common::pg::Migrate(conn, "guard");
    for (const auto& sql : i.schema) {
      pqxx::work tx(conn);
      tx.exec(sql);
      tx.commit();
    }
  }
  i.serving = std::make_unique<Impl::Serving>(i.options);
  auto& s = *i.serving;
  for (const auto& add : i.routes) add(i);
  s.server.Get(guard::kPolicyPath, s.http.Policy());
  s.server.Get(guard::kKeysPath, s.http.Keys());
  common::http::AddHealthRoutes(s.server, [&s] { return common::pg::Reachable(s.pool); });
  s.server.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(s.metrics.Render(), common::metrics::kContentType);
  });
  s.port = s.server.Bind(host, port);
  if (s.port < 0) {
    throw std::runtime_error("participant " + i.options.name + ": cannot listen on " + host + ":" +
                             std::to_string(port));
  }
  s.host = host;
  s.thread = std::thread([&s] { s.server.Serve(); });
  return s.port;
}

std::string Participant::Url() const {
  const auto& s = impl_->serving;
  return s ? "http://" + s->host + ":" + std::to_string(s->port) : "";
}

void Participant::Stop() {
  if (!impl_ || !impl_->serving || !impl_->serving->thread.joinable()) return;
  impl_->serving->server.Stop();
  impl_->serving->thread.join();
}

int Participant::Run(int argc, char** argv) {
  app::BlockStopSignals();
  auto& options = impl_->options;
  CLI::App cli{"the " + options.name + " participant, its routes guarded by idemsaga",
               options.name};
  std::string listen = "127.0.0.1:0";
  int retention_hours = static_cast<int>(options.retention.count());
  cli.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free one)")
      ->capture_default_str();
  cli.add_option("--database-url", options.database_url, "postgresql:// URL of its database")
      ->envname("IDEMSAGA_DATABASE_URL");
  cli.add_option("--service-token", options.service_token, "bearer token callers present")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cli.add_option("--retention-hours", retention_hours, "how long step keys are kept")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  try {
    cli.parse(argc, argv);
    options.retention = std::chrono::hours(retention_hours);
    auto [host, wanted] = common::SplitHostPort(listen);
    int port = Start(host, wanted);
    std::cout << options.name << " ready on http://" << host << ":" << port << std::endl;
    app::WaitForStopSignal();
    Stop();
    return 0;
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  } catch (const std::exception& e) {
    std::cerr << options.name << ": " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace idemsaga
