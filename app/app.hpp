// What an idemsaga::App was told (include/idemsaga/app.hpp), for the commands that read it,
// and the seam the stock binary adds its own commands through (the demo participants,
// `idemsaga dev`).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/run_client.hpp"
#include "idemsaga/app.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga {

struct App::Impl {
  AppOptions options;
  std::map<std::string, ParticipantOptions> participants;
  std::vector<SagaFactory> sagas;
  struct Flag {
    std::string flag, help;
    std::function<void(const std::string&)> set;
  };
  std::vector<Flag> flags;
  // The stock binary's demo token; "" for a team's: --service-token is required.
  std::string default_service_token;
  std::string default_listen = "127.0.0.1:8080";
  // The orchestrator the `orchestrator` command serves, for App::Start.
  std::shared_ptr<app::Serving> serving = std::make_shared<app::Serving>();
  // Commands of the binary's own, added beside the App's.
  std::vector<std::function<void(CLI::App&, app::Run&)>> commands;
  // Told each boundary of a saga's run (SagaServiceOptions::at_boundary): the stock binary's
  // fault injection; unset for a team's.
  steps::saga::Runner::AtBoundary at_boundary;
};

App::Impl& AppImpl(App& app);

}  // namespace idemsaga
