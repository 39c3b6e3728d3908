// idemsaga::Participant (include/idemsaga/participant.hpp) over the guard (steps/guard: its
// keys in PostgreSQL, or in Redis with RedisGuard) and the HTTP server, and its binary's command
// line (Run): the public types are copied to and from the guard's at the edge, so the guard's
// own may grow without a user seeing it. Both stores serve through the same HttpGuard, so the
// routes, the refusals and /metrics are the same bytes on either.
#include "idemsaga/participant.hpp"

#include <CLI/CLI.hpp>
#include <iostream>
#include <stdexcept>
#include <thread>

#include "app/amqp_commands_options.hpp"
#include "app/duplicates_option.hpp"
#include "app/serve_until_signal.hpp"
#include "app/signals.hpp"
#include "app/store_option.hpp"
#include "common/dynamo/client.hpp"
#include "common/http/server.hpp"
#include "common/metrics.hpp"
#include "common/net.hpp"
#include "common/periodic.hpp"
#include "common/pg/errors.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/placement.hpp"
#include "common/pg/pool.hpp"
#include "common/pg/url.hpp"
#include "common/redis/pool.hpp"
#include "steps/guard/dynamo_guard.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/http_guard.hpp"
#include "steps/guard/queue_commands.hpp"
#include "steps/guard/redis_guard.hpp"
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

guard::Guard::ExternalEffect Internal(ExternalEffect effect) {
  return [effect = std::move(effect)](const guard::ExternalCall& call) {
    Request request = Public(call.request);
    return Internal(effect(ExternalCall{request, call.earlier_attempt, call.deadline}));
  };
}

guard::Guard::ExternalUndo Internal(ExternalUndo undo) {
  return
      [undo = std::move(undo)](const guard::ExternalCall& call, const guard::ActionRecord& action) {
        Request request = Public(call.request);
        return undo(ExternalCall{request, call.earlier_attempt, call.deadline}, Public(action));
      };
}

// Where `o` keeps its keys: `store`, or redis with a Redis URL, else postgres.
std::string StoreOf(const ParticipantServiceOptions& o) {
  if (!o.store.empty()) return o.store;
  return o.redis_url.empty() ? "postgres" : "redis";
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
  // The routes whose effect is SQL on the guard's transaction: PostgreSQL only.
  std::vector<std::string> sql_routes;

  // The guard on one key store: PostgreSQL (`guard`, which also serves the SQL routes), Redis
  // (`redis_guard`) or DynamoDB (`dynamo_guard`); `store` is whichever it is.
  struct Serving {
    explicit Serving(const ParticipantServiceOptions& o)
        : guard_options{.retention = o.retention, .duplicates = Duplicates(o)},
          server(common::http::Limits{.threads = o.threads}, common::pg::Classify) {
      placement = common::pg::Placement::FromFlags(o.placement_url, o.cluster);
      guard::HttpGuardOptions http_options{.service_token = o.service_token,
                                           .metrics = &metrics,
                                           .service = o.name,
                                           .placement = placement.get()};
      const std::string kind = StoreOf(o);
      if (kind == "postgres") {
        pool = std::make_unique<common::pg::Pool>(
            common::pg::Pool::Options{.url = o.database_url, .size = o.pool_size});
        guard = std::make_unique<guard::Guard>(*pool, nullptr, guard_options);
        store = guard.get();
        http = std::make_unique<guard::HttpGuard>(*guard, http_options);
        return;
      }
      if (kind == "redis") {
        redis = std::make_unique<common::redis::Pool>(
            common::redis::Pool::Options{.url = o.redis_url, .size = o.pool_size});
        redis_guard = std::make_unique<guard::RedisGuard>(*redis, guard_options);
        store = redis_guard.get();
      } else {
        dynamo = std::make_unique<common::dynamo::Client>(
            common::dynamo::Client::FromEnvironment(o.dynamodb_url));
        dynamo_guard =
            std::make_unique<guard::DynamoGuard>(*dynamo, o.dynamodb_table, guard_options);
        store = dynamo_guard.get();
      }
      http = std::make_unique<guard::HttpGuard>(*store, http_options);
    }
    static guard::Duplicates Duplicates(const ParticipantServiceOptions& o) {
      return *guard::ParseDuplicates(o.duplicates);  // checked by Start
    }

    guard::GuardOptions guard_options;
    common::metrics::Registry metrics;
    std::unique_ptr<common::pg::Placement> placement;  // null: every tenant is served
    std::unique_ptr<common::pg::Pool> pool;
    std::unique_ptr<guard::Guard> guard;
    std::unique_ptr<common::redis::Pool> redis;
    std::unique_ptr<guard::RedisGuard> redis_guard;
    std::unique_ptr<common::dynamo::Client> dynamo;
    std::unique_ptr<guard::DynamoGuard> dynamo_guard;
    guard::KeyStore* store = nullptr;
    std::unique_ptr<guard::HttpGuard> http;
    common::http::Server server;
    std::string host;
    int port = 0;
    std::thread thread;
    // Every guarded route by path, for the commands from a queue; null without amqp_urls.
    guard::QueueCommands::Routes command_routes;
    std::unique_ptr<guard::QueueCommands> commands;
    std::unique_ptr<common::Periodic> gc;  // PostgreSQL only

    // A guarded route: served over HTTP, and from the queue when there is one.
    void Post(const std::string& path, common::http::Server::Handler handler) {
      command_routes[path] = handler;
      server.Post(path, std::move(handler));
    }
  };
  std::unique_ptr<Serving> serving;

  // Refuses what a Redis or DynamoDB key store cannot keep, naming it, before anything starts.
  void CheckKeyValueStore(const std::string& kind) const {
    const std::string who = "participant " + options.name + ": ";
    if (kind == "redis" && options.redis_url.empty()) {
      throw std::invalid_argument(who + "store redis needs a Redis URL");
    }
    if (kind == "dynamodb" && options.dynamodb_url.empty()) {
      throw std::invalid_argument(who + "store dynamodb needs a DynamoDB URL");
    }
    if (kind == "redis" && !guard::ParseRedisFsync(options.redis_fsync)) {
      throw std::invalid_argument(who + "redis_fsync is everysec, always or unchecked, not '" +
                                  options.redis_fsync + "'");
    }
    const std::string why =
        " is PostgreSQL-only (an effect in SQL on the guard's transaction); "
        "with store " +
        kind + ", use ExternalAction and ExternalCompensation";
    if (!schema.empty()) throw std::invalid_argument(who + "Schema" + why);
    if (!sql_routes.empty()) throw std::invalid_argument(who + sql_routes.front() + why);
  }
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
  impl_->sql_routes.push_back("Action " + path);
  impl_->routes.push_back([=](Impl& i) {
    i.serving->Post(path, i.serving->http->Action(
                              validate, [effect](pqxx::work& tx, const guard::Request& req) {
                                return Internal(effect(tx, Public(req)));
                              }));
  });
  return *this;
}

Participant& Participant::Compensation(const std::string& path, Undo undo) {
  impl_->sql_routes.push_back("Compensation " + path);
  impl_->routes.push_back([=](Impl& i) {
    i.serving->Post(path,
                    i.serving->http->Compensation([undo](pqxx::work& tx, const guard::Request& req,
                                                         const guard::ActionRecord& action) {
                      return undo(tx, Public(req), Public(action));
                    }));
  });
  return *this;
}

Participant& Participant::ExternalAction(const std::string& path, Validate validate,
                                         ExternalEffect effect) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->Post(path, i.serving->http->ExternalAction(validate, Internal(effect)));
  });
  return *this;
}

Participant& Participant::ExternalCompensation(const std::string& path, ExternalUndo undo) {
  impl_->routes.push_back([=](Impl& i) {
    i.serving->Post(path, i.serving->http->ExternalCompensation(Internal(undo)));
  });
  return *this;
}

int Participant::Start(const std::string& host, int port) {
  auto& i = *impl_;
  if (i.serving) throw std::logic_error("participant " + i.options.name + ": started already");
  const std::string kind = StoreOf(i.options);
  if (kind != "postgres" && kind != "redis" && kind != "dynamodb") {
    throw std::invalid_argument("participant " + i.options.name +
                                ": store is postgres, redis or dynamodb, not '" + kind + "'");
  }
  const bool on_pg = kind == "postgres";
  if (!on_pg) {
    i.CheckKeyValueStore(kind);
  } else if (i.options.database_url.empty()) {
    throw std::invalid_argument("participant " + i.options.name + ": no database URL");
  }
  if (i.options.service_token.empty()) {
    throw std::invalid_argument("participant " + i.options.name + ": no service token");
  }
  if (!guard::ParseDuplicates(i.options.duplicates)) {
    throw std::invalid_argument("participant " + i.options.name +
                                ": duplicates is wait or fail-fast, not '" + i.options.duplicates +
                                "'");
  }
  auto queue_type = guard::ParseQueueType(i.options.amqp_queue_type);
  if (!i.options.amqp_urls.empty() && i.options.amqp_consumers < 1) {
    throw std::invalid_argument("participant " + i.options.name + ": amqp_consumers is 1 or more");
  }
  if (!queue_type) {
    throw std::invalid_argument("participant " + i.options.name +
                                ": amqp_queue_type is classic or quorum, not '" +
                                i.options.amqp_queue_type + "'");
  }
  if (on_pg) {
    pqxx::connection conn(common::pg::WithSessionTimeouts(i.options.database_url));
    common::pg::Migrate(conn, "guard");
    for (const auto& sql : i.schema) {
      pqxx::work tx(conn);
      tx.exec(sql);
      tx.commit();
    }
  }
  auto serving = std::make_unique<Impl::Serving>(i.options);
  auto& s = *serving;
  if (kind == "redis") s.redis_guard->CheckServer(*guard::ParseRedisFsync(i.options.redis_fsync));
  if (kind == "dynamodb") s.dynamo_guard->EnsureTable();
  i.serving = std::move(serving);
  for (const auto& add : i.routes) add(i);
  s.server.Get(steps::protocol::kPolicyPath, s.http->Policy());
  s.server.Get(steps::protocol::kKeysPath, s.http->Keys());
  common::http::AddHealthRoutes(s.server, [&s] { return s.store->Ready(); });
  s.server.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(s.metrics.Render(), common::metrics::kContentType);
  });
  s.port = s.server.Bind(host, port);
  if (s.port < 0) {
    throw std::runtime_error("participant " + i.options.name + ": cannot listen on " + host + ":" +
                             std::to_string(port));
  }
  s.host = host;
  if (!i.options.amqp_urls.empty()) {
    s.commands = std::make_unique<guard::QueueCommands>(
        guard::QueueCommandsOptions{
            .urls = i.options.amqp_urls,
            .queue = i.options.amqp_queue.empty() ? i.options.name : i.options.amqp_queue,
            .queue_type = *queue_type,
            .consumers = i.options.amqp_consumers,
            .max_wait = i.options.amqp_max_wait,
            .classify = common::pg::Classify},
        s.command_routes, &s.metrics);
    s.commands->Start();
  }
  if (s.guard) {
    s.gc = std::make_unique<common::Periodic>("participant_gc", i.options.gc_interval, [&s] {
      s.gc->Drain([&s] { return s.guard->DeleteExpired(1000); }, 1000);
    });
    s.gc->Start();
  }
  s.thread = std::thread([&s] { s.server.Serve(); });
  return s.port;
}

std::string Participant::Url() const {
  const auto& s = impl_->serving;
  return s ? "http://" + s->host + ":" + std::to_string(s->port) : "";
}

void Participant::Stop() {
  if (!impl_ || !impl_->serving || !impl_->serving->thread.joinable()) return;
  if (impl_->serving->commands) impl_->serving->commands->Stop();
  if (impl_->serving->gc) impl_->serving->gc->Stop();
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
  cli.add_option("--placement-url", options.placement_url,
                 "tenants on several PostgreSQL clusters: postgresql:// URL of the directory "
                 "database; serve only the tenants placed on --cluster")
      ->envname("IDEMSAGA_PLACEMENT_URL");
  cli.add_option("--cluster", options.cluster,
                 "with --placement-url: the name of the cluster its database is on")
      ->envname("IDEMSAGA_CLUSTER");
  cli.add_option("--redis-url", options.redis_url,
                 "redis:// URL: keep the keys in Redis instead of PostgreSQL")
      ->envname("IDEMSAGA_REDIS_URL");
  cli.add_option("--redis-fsync", options.redis_fsync,
                 "the persistence Redis must have: everysec, always or unchecked")
      ->capture_default_str();
  app::AddStoreOption(&cli, options.store)->envname("IDEMSAGA_STORE");
  cli.add_option("--dynamodb-url", options.dynamodb_url,
                 "http://HOST:PORT of DynamoDB's API, with --store dynamodb (credentials and "
                 "region: the AWS_* environment variables)")
      ->envname("IDEMSAGA_DYNAMODB_URL");
  cli.add_option("--dynamodb-table", options.dynamodb_table,
                 "the keys' table, with --store dynamodb (created when missing)")
      ->capture_default_str();
  app::AddDuplicatesOption(&cli, options.duplicates);
  app::AmqpCommandFlags amqp{.urls = options.amqp_urls,
                             .queue = options.amqp_queue,
                             .queue_type = options.amqp_queue_type,
                             .consumers = options.amqp_consumers,
                             .max_wait_ms = options.amqp_max_wait.count()};
  app::AddAmqpCommandOptions(&cli, amqp, "IDEMSAGA_");
  try {
    cli.parse(argc, argv);
    options.retention = std::chrono::hours(retention_hours);
    options.amqp_urls = amqp.urls;
    options.amqp_queue = amqp.queue;
    options.amqp_queue_type = amqp.queue_type;
    options.amqp_consumers = amqp.consumers;
    options.amqp_max_wait = std::chrono::milliseconds(amqp.max_wait_ms);
    auto [host, wanted] = common::SplitHostPort(listen);
    int port = Start(host, wanted);
    app::ServeUntilSignal serving(options.name);
    serving.Add(nullptr, [this] { Stop(); });  // Start serves on a thread of its own
    serving.Wait(options.name + " ready on http://" + host + ":" + std::to_string(port));
    serving.Stop();
    return 0;
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  } catch (const std::exception& e) {
    std::cerr << options.name << ": " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace idemsaga
