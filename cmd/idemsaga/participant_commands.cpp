#include <memory>
#include <optional>

#include "app/amqp_commands_options.hpp"
#include "app/commands.hpp"
#include "app/duplicates_option.hpp"
#include "app/serve_until_signal.hpp"
#include "cmd/idemsaga/stock.hpp"
#include "common/defaults.hpp"
#include "common/net.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/placement.hpp"
#include "common/pg/url.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"

namespace idemsaga::cmd {
namespace {

using demo::ParticipantKind;
using demo::ParticipantService;

struct ParticipantFlags {
  std::string listen;
  std::string database_url;
  std::string service_token = demo::kServiceToken;
  std::string otlp_endpoint;
  std::vector<std::string> otlp_headers;
  bool migrate = false;
  int retention_hours = 24 * 7;
  std::string duplicates = "wait";
  std::string store = "postgres";
  std::string redis_url = "redis://127.0.0.1:6379";
  std::string redis_fsync = "everysec";
  std::string placement_url;
  std::string cluster;
  demo::FaultSettings faults;
  app::AmqpCommandFlags amqp;
};

void AddParticipantCommand(CLI::App& app, ParticipantKind kind, app::Run& run) {
  auto flags_ptr = std::make_shared<ParticipantFlags>();
  auto& flags = *flags_ptr;
  const std::string name = demo::NameOf(kind);
  auto* cmd = app.add_subcommand(name, "Run the demo " + name + " participant");
  // The port `idemsaga dev` gives it too.
  flags.listen = common::defaults::LocalListen(demo::StackParticipantNamed(name).port);
  std::string upper_name = name;
  for (char& c : upper_name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", flags.database_url,
                  "postgresql:// URL of its database (required unless --store redis)")
      ->envname("IDEMSAGA_" + upper_name + "_DATABASE_URL");
  if (kind == ParticipantKind::kInventory) {
    cmd->add_option("--store", flags.store,
                    "where stock, reservations and keys live: postgres (--database-url) or "
                    "redis (--redis-url)")
        ->check(CLI::IsMember({"postgres", "redis"}))
        ->envname("IDEMSAGA_INVENTORY_STORE")
        ->capture_default_str();
    cmd->add_option("--redis-url", flags.redis_url, "redis://HOST:PORT[/DB] with --store redis")
        ->envname("IDEMSAGA_INVENTORY_REDIS_URL")
        ->capture_default_str();
    cmd->add_option("--redis-fsync", flags.redis_fsync,
                    "the persistence Redis must have at start-up: everysec (appendonly yes; a "
                    "crash may lose ~1 s of keys), always (appendfsync always), or unchecked")
        ->check(CLI::IsMember({"everysec", "always", "unchecked"}))
        ->envname("IDEMSAGA_INVENTORY_REDIS_FSYNC")
        ->capture_default_str();
  } else {
    // Only the inventory has a Redis store: say so rather than "unknown option".
    cmd->add_option_function<std::string>(
           "--store",
           [name](const std::string& store) {
             if (store != "postgres") {
               throw CLI::ValidationError("--store", name +
                                                         " keeps its store in PostgreSQL only; "
                                                         "--store redis is for the inventory");
             }
           },
           "postgres (the only store of the " + name + ")")
        ->envname("IDEMSAGA_" + upper_name + "_STORE");
  }
  cmd->add_option("--service-token", flags.service_token,
                  std::string("bearer token callers must present (dev default: ") +
                      demo::kServiceToken + ")")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cmd->add_flag("--migrate", flags.migrate, "apply pending migrations before serving");
  cmd->add_option("--otlp-endpoint", flags.otlp_endpoint,
                  "where spans go (OTLP/HTTP JSON), e.g. the orchestrator's "
                  "http://127.0.0.1:8080/v1/traces; none by default");
  app::AddOtlpHeaderOption(cmd, flags.otlp_headers);
  cmd->add_option("--retention-hours", flags.retention_hours,
                  "how long step keys are kept (must exceed the orchestrator's retention plus "
                  "its longest saga; it checks at start-up)")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  app::AddDuplicatesOption(cmd, flags.duplicates);
  app::AddAmqpCommandOptions(cmd, flags.amqp, "IDEMSAGA_" + upper_name + "_");
  cmd->add_option("--placement-url", flags.placement_url,
                  "tenants on several PostgreSQL clusters: postgresql:// URL of the directory "
                  "database (tenant_placement); serve only the tenants placed on --cluster");
  cmd->add_option("--cluster", flags.cluster,
                  "with --placement-url: the name of the cluster this participant's database is "
                  "on");
  cmd->add_option("--fault-error-rate", flags.faults.error_rate, "share of requests answered 503")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-drop-rate", flags.faults.drop_after_commit_rate,
                  "share of requests committed, then dropped without an answer")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--fault-latency-ms", flags.faults.latency_ms, "delay added to every answer")
      ->check(CLI::Range(0, 600000));
  cmd->callback([flags_ptr, kind, &run] {
    auto& flags = *flags_ptr;
    const bool redis = flags.store == "redis";
    if (!redis && flags.database_url.empty()) {
      throw CLI::RequiredError("--database-url");
    }
    if (redis && flags.migrate) {
      throw CLI::ValidationError("--migrate", "there is nothing to migrate with --store redis");
    }
    run = [flags_ptr, kind, redis] {
      auto& flags = *flags_ptr;
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.database_url));
        common::pg::Migrate(conn, demo::NameOf(kind));
      }
      auto [host, port] = common::SplitHostPort(flags.listen);
      auto placement = common::pg::Placement::FromFlags(flags.placement_url, flags.cluster);
      ParticipantService svc(
          kind, flags.database_url,
          {.service_token = flags.service_token,
           .otlp_endpoint = flags.otlp_endpoint,
           .otlp_headers = app::ParseHeaders(flags.otlp_headers),
           .guard = {.retention = std::chrono::hours(flags.retention_hours),
                     .duplicates = *steps::guard::ParseDuplicates(flags.duplicates)},
           .redis_url = redis ? flags.redis_url : "",
           .redis_fsync = flags.redis_fsync,
           .placement = placement.get(),
           .amqp = {.urls = flags.amqp.urls,
                    .queue = flags.amqp.queue,
                    .queue_type = *steps::guard::ParseQueueType(flags.amqp.queue_type),
                    .consumers = flags.amqp.consumers,
                    .max_wait = std::chrono::milliseconds(flags.amqp.max_wait_ms)}},
          flags.faults);
      int bound = svc.Bind(host, port);
      app::ServeUntilSignal serving(demo::NameOf(kind));
      serving.Add([&] { svc.Serve(); }, [&] { svc.Stop(); });
      serving.Wait(std::string(demo::NameOf(kind)) + " ready on http://" + host + ":" +
                   std::to_string(bound));
      serving.Stop();
    };
  });
}

}  // namespace

void AddParticipantCommands(CLI::App& app, app::Run& run) {
  for (auto kind :
       {ParticipantKind::kInventory, ParticipantKind::kPayment, ParticipantKind::kShipping}) {
    AddParticipantCommand(app, kind, run);
  }
}

}  // namespace idemsaga::cmd
