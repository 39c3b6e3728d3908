// An orchestrator for the benchmarks (bench/bulkhead.sh, bench/waiting.sh), run as its own
// process against participants elsewhere: the shipped sagas plus reserve_stock, a saga of the
// bench's own that calls only the inventory (POST /v1/runs/reserve_stock with
// {"items":[...]}), so a run can tell whether a slow payment participant slows the sagas that
// never call it. Its thread pools are flags, which `idemsaga orchestrator` does not have.
// Migrates its database and registers the tenants' API keys at start-up; SIGINT or SIGTERM
// stops it.
//   bench_orchestrator --database-url URL --listen 127.0.0.1:21090 --api-key demo=dev-key-demo \
//     --participant inventory=http://127.0.0.1:21081 --participant payment=http://127.0.0.1:21082
#include <signal.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>
#include <thread>

#include "common/crypto.hpp"
#include "common/net.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"
#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"
#include "steps/order_schema.hpp"
#include "steps/place_order.hpp"

namespace {

idemsaga::steps::saga::Definition MakeReserveStockSaga(idemsaga::Participants& participants) {
  auto& inventory = participants.Get("inventory");
  return std::move(idemsaga::steps::saga::Definition("reserve_stock", /*version=*/1)
                       .Input<nlohmann::json>([](const nlohmann::json& body) {
                         if (auto problem = idemsaga::steps::ValidateReservation(body);
                             !problem.empty()) {
                           throw idemsaga::steps::saga::InvalidInput(problem);
                         }
                         return body;
                       })
                       .Step("inventory", idemsaga::steps::ReserveItems(inventory),
                             idemsaga::steps::ReleaseItems(inventory)));
}

// "NAME=VALUE" -> {NAME, VALUE}; throws CLI::ValidationError without a '='.
std::pair<std::string, std::string> SplitPair(const std::string& flag, const std::string& v) {
  auto eq = v.find('=');
  if (eq == std::string::npos || eq == 0) throw CLI::ValidationError(flag, "NAME=VALUE: " + v);
  return {v.substr(0, eq), v.substr(eq + 1)};
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  std::vector<std::string> participants, api_keys;
  idemsaga::orchestrator::OrchestratorOptions options;
  CLI::App app{"idemsaga benchmark orchestrator (shipped sagas + reserve_stock)"};
  app.add_option("--database-url", options.database_url, "its database")->required();
  app.add_option("--listen", listen, "HOST:PORT")->capture_default_str();
  app.add_option("--participant", participants, "NAME=URL (repeatable)");
  app.add_option("--api-key", api_keys, "TENANT=KEY (repeatable)");
  app.add_option("--saga-threads", options.sagas.threads,
                 "the saga pool (recovery's resumptions, hand-offs past the inline limit)")
      ->capture_default_str();
  app.add_option("--server-threads", options.limits.threads, "HTTP workers")->capture_default_str();
  app.add_option("--inline-limit", options.sagas.inline_limit,
                 "sagas run on their requests' workers at most (below --server-threads)")
      ->capture_default_str();
  app.add_option("--pool-size", options.pool_size, "PostgreSQL connections")->capture_default_str();
  app.add_option("--participant-max-in-flight", options.participant_max_in_flight,
                 "the bulkhead: calls in flight to each participant (0: no limit)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // Before any thread starts, so that only sigwait below sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  try {
    // The demo participants' refusals and token, as the stock binary passes them.
    options.service_token = idemsaga::demo::kServiceToken;
    for (const auto& p : idemsaga::demo::kStackParticipants) {
      options.participants[p.name].business_errors = p.business_errors;
    }
    for (const auto& p : participants) {
      auto [name, url] = SplitPair("--participant", p);
      options.participants[name].base_url = url;
    }
    {
      pqxx::connection conn(idemsaga::common::pg::WithSessionTimeouts(options.database_url));
      idemsaga::common::pg::Migrate(conn, "orchestrator");
    }
    auto sagas = idemsaga::steps::ShippedSagas();
    sagas.push_back(MakeReserveStockSaga);
    idemsaga::orchestrator::Orchestrator o(options, sagas);
    for (const auto& k : api_keys) {
      auto [tenant, key] = SplitPair("--api-key", k);
      o.store().UpsertTenant(tenant, idemsaga::common::Sha256Hex(key));
    }
    auto [host, port] = idemsaga::common::SplitHostPort(listen);
    int bound = o.Bind(host, port);
    std::thread server([&] { o.Serve(); });
    std::cout << "bench orchestrator ready on http://" << host << ":" << bound << std::endl;
    int sig = 0;
    sigwait(&stop, &sig);
    o.Shutdown(std::chrono::seconds(10));
    server.join();
  } catch (const std::exception& e) {
    std::cerr << "bench_orchestrator: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
