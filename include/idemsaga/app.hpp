// An orchestrator binary of a team's own: its main() declares the participants its sagas call
// and the sagas, then hands the command line over. The binary then has every subcommand, flag,
// IDEMSAGA_* variable and behaviour of the stock `idemsaga orchestrator`: `orchestrator`
// (migrations with --migrate, the participants' retention check at start-up, recovery, garbage
// collection, the reconcile job, metrics, traces and pages, the AMQP intake with --amqp-url,
// a drain on SIGTERM), `migrate`, `tenant create|list|revoke`, `sagas list|retry|cancel|
// resolve`, `reconcile`, `event`, `trace`, `orders get`. Every saga is served at POST
// /v1/runs/{name} (and over AMQP with the message header `saga: name`), and /openapi.json
// documents each with its input schema (Definition::InputSchema).
//
// Nothing is defaulted for a team: a participant without a URL (here or --participant
// NAME=URL) is not configured, and the service token is required (--service-token or
// IDEMSAGA_SERVICE_TOKEN). One App per process; Run() once.
//   int main(int argc, char** argv) {
//     idemsaga::App app({.name = "trips"});
//     app.Participant("hotel", {.url = "http://127.0.0.1:9001"})
//         .Participant("car", {.business_errors = {"no_cars"}})
//         .Saga(MakeTripSaga);
//     return app.Run(argc, argv);
//   }
//
// Part of idemsaga's public API (CHANGELOG.md says what may change between versions).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "idemsaga/saga.hpp"

namespace idemsaga {

struct AppOptions {
  std::string name = "idemsaga";  // the binary's name, in --help and the logs
  std::string description = "a saga orchestrator with idempotency keys end to end";
};

// A participant as the orchestrator calls it.
struct ParticipantOptions {
  // Its base URL (http://host:port); --participant NAME=URL sets or replaces it. Empty: the
  // participant is not configured, and a saga that needs it is not served.
  std::string url;
  // Its business refusals: the only 4xx error codes that fail a saga for good (compensated,
  // answered to the client). Any other 4xx is a configuration fault: the saga waits, stuck.
  std::set<std::string> business_errors;
};

class App {
 public:
  explicit App(AppOptions options = {});
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // Throws std::invalid_argument for a name that is not 1..32 of [a-z0-9_].
  App& Participant(const std::string& name, ParticipantOptions options = {});
  // Built once at start-up over the configured participants (see SagaFactory).
  App& Saga(SagaFactory make);
  // A flag of the team's own on `orchestrator` (also read from IDEMSAGA_<FLAG>): `set` gets
  // its value before the sagas are built, and throws std::invalid_argument to refuse it.
  App& Option(const std::string& flag, const std::string& help,
              std::function<void(const std::string& value)> set);

  // Parses the command line and runs the subcommand; returns the process's exit code (0,
  // 1 on an error it printed, 2 for a usage error, as CLI tools do).
  int Run(int argc, char** argv);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend Impl& AppImpl(App& app);
};

}  // namespace idemsaga
