#include <iostream>
#include <memory>
#include <optional>

#include "app/app.hpp"
#include "app/commands.hpp"
#include "app/serve_until_signal.hpp"
#include "common/defaults.hpp"
#include "common/log.hpp"
#include "common/net.hpp"
#include "common/pg/errors.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "common/strings.hpp"
#include "orchestrator/amqp/intake.hpp"
#include "orchestrator/amqp/step_queue.hpp"
#include "orchestrator/orchestrator.hpp"

namespace idemsaga::app {
namespace {

struct OrchestratorFlags {
  std::string listen;
  std::vector<std::string> otlp_headers;
  bool migrate = false;
  int retention_hours = 24;
  std::chrono::milliseconds grace{10000};
  std::vector<std::string> participants;  // NAME=URL
  orchestrator::OrchestratorOptions options;
  orchestrator::amqp::IntakeOptions amqp;       // no urls: no intake
  std::string amqp_events_queue;                // "": <amqp.queue>.events
  std::vector<std::string> queue_participants;  // NAME=QUEUE
  std::string reply_queue = "idemsaga.replies";
  std::chrono::milliseconds reply_timeout{10000};
};

// NAME=QUEUE, NAME of [a-z0-9_] and a queue name AMQP takes (1..255 bytes, printable).
std::string CheckQueueParticipantFlag(const std::string& value) {
  auto eq = value.find('=');
  if (eq == std::string::npos || !steps::saga::IsValidStepName(value.substr(0, eq)) ||
      value.size() - eq - 1 < 1 || value.size() - eq - 1 > 255) {
    return "expected NAME=QUEUE with NAME of [a-z0-9_]";
  }
  return "";
}

// Each of --amqp-url's URLs, at start-up, not at the first connection; the message does not
// echo the URL (credentials).
std::string CheckAmqpUrl(const std::string& url) {
  try {
    orchestrator::amqp::CheckUrl(url);
    return "";
  } catch (const std::invalid_argument&) {
    return "expected amqp://user:password@host:port/vhost, one per node";
  }
}

}  // namespace

void AddOrchestratorCommand(CLI::App& app, Run& run, const idemsaga::App::Impl& setup) {
  auto flags_ptr = std::make_shared<OrchestratorFlags>();
  auto& flags = *flags_ptr;
  flags.listen = setup.default_listen;
  // The participants the App declared, and nothing else: no demo default reaches a team.
  flags.options.participants.clear();
  for (const auto& [name, p] : setup.participants) {
    flags.options.participants[name] = {.base_url = p.url, .business_errors = p.business_errors};
  }
  flags.options.service_token = setup.default_service_token;
  flags.options.sagas.at_boundary = setup.at_boundary;
  flags.amqp.classify = common::pg::Classify;  // the intake submits to PostgreSQL's stores
  auto* cmd = app.add_subcommand("orchestrator", "Run the coordinator service (the runs API)");
  auto& o = flags.options;
  cmd->add_option("--listen", flags.listen, "HOST:PORT to listen on")->capture_default_str();
  cmd->add_option("--database-url", o.database_url, "postgresql:// URL of its database")
      ->envname("IDEMSAGA_DATABASE_URL")
      ->required();
  std::string known;
  for (const auto& [name, p] : setup.participants) {
    known += (known.empty() ? "" : ", ") + name + (p.url.empty() ? "" : "=" + p.url);
  }
  cmd->add_option("--participant", flags.participants,
                  "NAME=URL: where the participant NAME is (repeatable; declared: " + known +
                      "; a saga whose participant has no URL is not served)")
      ->envname("IDEMSAGA_PARTICIPANTS")
      ->delimiter(',')
      ->check(CheckParticipantFlag);
  for (const auto& [name, p] : setup.participants) {  // --hotel-url, as --participant hotel=
    std::string flag = "--" + name + "-url";
    std::replace(flag.begin(), flag.end(), '_', '-');
    cmd->add_option_function<std::string>(
        flag, [&o, name](const std::string& url) { o.participants[name].base_url = url; },
        "same as --participant " + name + "=URL");
  }
  cmd->add_option("--service-token", o.service_token, "token presented to participants")
      ->envname("IDEMSAGA_SERVICE_TOKEN");
  cmd->add_flag("--migrate", flags.migrate, "apply pending migrations before serving");
  cmd->add_option("--max-attempts", o.retry.max_attempts,
                  "attempts per step action (the step deadline usually ends retries first)")
      ->capture_default_str();
  cmd->add_option("--step-deadline-ms", o.retry.step_deadline,
                  "no new attempt of a step's action after this (rides out a participant "
                  "restart)")
      ->capture_default_str();
  cmd->add_option("--initial-backoff-ms", o.retry.initial_backoff,
                  "full-jitter backoff: first cap, doubled per attempt")
      ->capture_default_str();
  cmd->add_option("--max-backoff-ms", o.retry.max_backoff, "largest backoff between attempts")
      ->capture_default_str();
  cmd->add_option("--lease-seconds", o.store.lease, "saga lease, renewed while it runs")
      ->capture_default_str();
  cmd->add_option("--response-budget-ms", o.sagas.response_budget,
                  "answer 202 when a saga takes longer")
      ->capture_default_str();
  cmd->add_option("--otlp-endpoint", o.otlp_endpoint,
                  "send spans to this OTLP/HTTP endpoint instead of storing them here");
  AddOtlpHeaderOption(cmd, flags.otlp_headers);
  cmd->add_option("--participant-timeout-ms", o.participant_timeout,
                  "read timeout of one participant call")
      ->capture_default_str();
  cmd->add_option("--participant-max-in-flight", o.participant_max_in_flight,
                  "calls in flight to each participant at most; a saga past it waits, parked "
                  "(0: no limit)")
      ->capture_default_str();
  cmd->add_option("--tenant-running-limit", o.sagas.tenant_running_limit,
                  "sagas of one tenant running at once in this process at most; more wait, "
                  "queued (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--http-threads", o.limits.threads,
                  "HTTP workers: requests handled at once (a saga's wait holds none)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1024));
  cmd->add_option("--saga-threads", o.sagas.threads,
                  "sagas running at once on the saga pool (past --inline-limit, and resumed "
                  "ones); more wait, queued")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--inline-limit", o.sagas.inline_limit,
                  "sagas run on their requests' own HTTP workers at most (below "
                  "--http-threads); the rest run on the saga pool")
      ->capture_default_str();
  cmd->add_option("--park-after-ms", o.retry.park_after,
                  "a wait this long or longer holds no thread: the saga is parked and resumed "
                  "when due (0: never park)")
      ->capture_default_str();
  for (const auto& f : setup.flags) {  // the App's own (App::Option)
    cmd->add_option_function<std::string>(
        f.flag,
        [set = f.set, flag = f.flag](const std::string& value) {
          try {
            set(value);
          } catch (const std::invalid_argument& e) {
            throw CLI::ValidationError(flag, e.what());
          }
        },
        f.help);
  }
  cmd->add_option("--sweep-interval-ms", o.recovery.sweep_interval,
                  "how often recovery looks for expired leases")
      ->capture_default_str();
  cmd->add_option("--stuck-retry-ms", o.retry.stuck_retry_interval,
                  "pace of retries for a stuck compensation")
      ->capture_default_str();
  cmd->add_option("--retention-hours", flags.retention_hours,
                  "how long finished keys are kept, counted from the end of their saga")
      ->check(CLI::Range(1, 24 * 365))
      ->capture_default_str();
  cmd->add_option("--reconcile-interval-ms", o.reconcile_interval,
                  "how often to reconcile sagas with the participants' keys (0: never)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--reconcile-since",
         [&o](const std::string& v) { o.reconcile_since = *orchestrator::ParseDuration(v); },
         "the window each reconciliation checks, e.g. 1h (default)")
      ->check(CheckDuration);
  cmd->add_option("--shutdown-grace-ms", flags.grace,
                  "on SIGTERM, how long running sagas may finish")
      ->capture_default_str();
  cmd->add_option("--placement-url", o.placement_url,
                  "tenants on several PostgreSQL clusters: postgresql:// URL of the directory "
                  "database (tenant_placement); serve only the tenants placed on --cluster");
  cmd->add_option("--cluster", o.cluster,
                  "with --placement-url: the name of the cluster this orchestrator's database is "
                  "on");
  cmd->add_option("--amqp-url", flags.amqp.urls,
                  "also take orders and events from RabbitMQ: "
                  "amqp://user:password@host:port/vhost; for a cluster, one per node "
                  "(repeatable, or comma-separated): consumers connect to the first and, when "
                  "a connection breaks, to the next")
      ->envname("IDEMSAGA_AMQP_URL")
      ->delimiter(',')
      ->check(CheckAmqpUrl);
  cmd->add_option("--amqp-queue", flags.amqp.queue,
                  "the queue orders come from (refused ones go to QUEUE.dead)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--amqp-queue-type",
         [&flags](const std::string& type) {
           flags.amqp.queue_type = common::IEquals(type, "quorum")
                                       ? common::amqp::QueueType::kQuorum
                                       : common::amqp::QueueType::kClassic;
         },
         "classic or quorum: what the queues are declared as when they do not exist "
         "(quorum on a cluster: replicated, so they outlive a node)")
      ->check(CLI::IsMember({"classic", "quorum"}, CLI::ignore_case))
      ->default_str("classic");
  cmd->add_option("--amqp-events-queue", flags.amqp_events_queue,
                  "the queue external events for waiting runs come from (default: the "
                  "--amqp-queue name + .events; refused ones go to EVENTS_QUEUE.dead)");
  cmd->add_option("--participant-queue", flags.queue_participants,
                  "NAME=QUEUE: the participant NAME takes its commands from the RabbitMQ queue "
                  "QUEUE (of --amqp-url) and replies to --step-reply-queue; a saga step calling "
                  "it parks until the reply (repeatable)")
      ->delimiter(',')
      ->check(CheckQueueParticipantFlag);
  cmd->add_option("--step-reply-queue", flags.reply_queue,
                  "the queue participants reply to saga steps on (refused replies go to "
                  "QUEUE.dead)")
      ->capture_default_str();
  cmd->add_option("--step-reply-timeout-ms", flags.reply_timeout,
                  "how long a step over a queue waits, parked, for its reply before it "
                  "publishes its command again (same key: the participant replays)")
      ->capture_default_str();
  cmd->add_option("--amqp-consumers", flags.amqp.consumers,
                  "connections consuming each queue, each with one message in hand at a time")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--amqp-max-wait-ms", flags.amqp.max_wait,
                  "how long a message waits for its saga before going back to the queue")
      ->capture_default_str();
  cmd->callback([flags_ptr, &run, &setup] {
    if (flags_ptr->options.service_token.empty()) {
      throw CLI::RequiredError("--service-token (or IDEMSAGA_SERVICE_TOKEN)");
    }
    // A worker must stay free for reads, polls and health checks whatever the sagas do.
    if (flags_ptr->options.sagas.inline_limit >= flags_ptr->options.limits.threads) {
      throw CLI::ValidationError("--inline-limit", "must be below --http-threads");
    }
    run = [flags_ptr, &setup] {
      auto& flags = *flags_ptr;
      if (flags.migrate) {
        pqxx::connection conn(common::pg::WithSessionTimeouts(flags.options.database_url));
        common::pg::Migrate(conn, "orchestrator");
      }
      auto [host, port] = common::SplitHostPort(flags.listen);
      flags.options.store.retention = std::chrono::hours(flags.retention_hours);
      flags.options.otlp_headers = ParseHeaders(flags.otlp_headers);
      for (const auto& p : flags.participants) {
        auto eq = p.find('=');
        flags.options.participants[p.substr(0, eq)].base_url = p.substr(eq + 1);
      }
      if (!flags.queue_participants.empty() && flags.amqp.urls.empty()) {
        throw CLI::RequiredError("--amqp-url (for --participant-queue)");
      }
      for (const auto& p : flags.queue_participants) {
        auto eq = p.find('=');
        orchestrator::amqp::QueueParticipantOptions q{
            .urls = flags.amqp.urls,
            .queue = p.substr(eq + 1),
            .reply_queue = flags.reply_queue,
            .service_token = flags.options.service_token,
            .business_errors = flags.options.participants[p.substr(0, eq)].business_errors,
            .reply_timeout = flags.reply_timeout};
        flags.options.participants[p.substr(0, eq)].base_url.clear();
        flags.options.other_participants[p.substr(0, eq)] =
            [q](orchestrator::store::ReplyStore& replies, common::metrics::Registry& metrics) {
              return std::make_unique<orchestrator::amqp::QueueParticipantClient>(q, replies,
                                                                                  &metrics);
            };
      }
      orchestrator::Orchestrator o(flags.options, setup.sagas);
      o.CheckParticipantRetention();
      int bound = o.Bind(host, port);
      std::optional<orchestrator::amqp::Intake> intake, events;  // outlive their stops
      std::optional<orchestrator::amqp::ReplyConsumer> replies;
      ServeUntilSignal serving("orchestrator");
      serving.Add([&] { o.Serve(); }, [&] { o.Shutdown(flags.grace); });
      if (!flags.queue_participants.empty()) {
        // Stopped before the sagas drain (reverse order): a reply left unconsumed waits in its
        // queue for the next process, and a run left waiting is parked, woken by its timeout.
        replies.emplace(orchestrator::amqp::ReplyConsumerOptions{.urls = flags.amqp.urls,
                                                                 .queue = flags.reply_queue},
                        o.replies(), &o.metrics());
        replies->Start();
        serving.Add(nullptr, [&] { replies->Stop(); });
      }
      if (!flags.amqp.urls.empty()) {
        const auto& limits = o.server().limits();
        orchestrator::amqp::IntakeServices services{
            o.runs(), o.events(), o.auth(), {limits.max_body_bytes, limits.max_json_depth}};
        intake.emplace(flags.amqp, services, &o.metrics());
        auto events_options = flags.amqp;
        events_options.carries = orchestrator::amqp::Carries::kEvents;
        events_options.queue = flags.amqp_events_queue.empty() ? flags.amqp.queue + ".events"
                                                               : flags.amqp_events_queue;
        events.emplace(events_options, services, &o.metrics());
        // Stopped before the orchestrator drains (reverse order): a message whose answer is
        // not final yet goes back to its queue.
        intake->Start();
        serving.Add(nullptr, [&] { intake->Stop(); });
        events->Start();
        serving.Add(nullptr, [&] { events->Stop(); });
      }
      // App::Start's from here on, until it is withdrawn before `o` goes.
      Published published(*setup.serving, o);
      serving.Wait("orchestrator ready on http://" + host + ":" + std::to_string(bound));
      serving.Stop();
    };
  });
}

}  // namespace idemsaga::app
