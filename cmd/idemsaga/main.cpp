// idemsaga: one binary for every service and tool.
//   idemsaga dev                      the whole stack on a private PostgreSQL (.idemsaga/)
//   idemsaga orchestrator ...         the coordinator service
//   idemsaga inventory|payment|shipping ...  one demo participant
//   idemsaga migrate ...              apply the embedded SQL migrations
//   idemsaga tenant create NAME       a tenant and its API key (printed once)
//   idemsaga order ... / orders get K submit an order, read a saga
#include <CLI/CLI.hpp>
#include <iostream>

#include "cmd/idemsaga/client_commands.hpp"
#include "cmd/idemsaga/commands.hpp"
#include "cmd/idemsaga/signals.hpp"
#include "common/memory.hpp"
#include "common/periodic.hpp"

int main(int argc, char** argv) {
  common::TuneAllocator();
  idemsaga_cmd::BlockStopSignals();
  CLI::App app{"idemsaga: a saga orchestrator with idempotency keys end to end"};
  app.require_subcommand(1);
  // Options of the app (--log-format) may also follow the subcommand.
  app.fallthrough();
  idemsaga_cmd::AddLogFormatOption(app);
  idemsaga_cmd::Run run;
  idemsaga_cmd::ClientFlags client_flags;
  idemsaga_cmd::AddDevCommand(app, run);
  idemsaga_cmd::AddOrchestratorCommand(app, run);
  idemsaga_cmd::AddParticipantCommands(app, run);
  idemsaga_cmd::AddAdminCommands(app, run);
  idemsaga_cmd::AddClientCommands(app, client_flags, run);
  idemsaga_cmd::ReadFlagsFromEnvironment(app);
  try {
    app.parse(argc, argv);
    // Servers give memory back after a burst; a client command ends before the first run.
    common::Periodic trim("return_free_memory", std::chrono::seconds(2), common::ReturnFreeMemory);
    trim.Start();
    if (run) run();
    return idemsaga_cmd::ExitCode();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "idemsaga: " << e.what() << std::endl;
    return 1;
  }
}
