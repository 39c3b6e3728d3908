#include "app/app.hpp"

#include <iostream>
#include <stdexcept>

#include "app/client_commands.hpp"
#include "app/signals.hpp"
#include "common/memory.hpp"
#include "common/periodic.hpp"

namespace idemsaga {

App::App(AppOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
}

App::~App() = default;

App::Impl& AppImpl(App& app) { return *app.impl_; }

App& App::Participant(const std::string& name, ParticipantOptions options) {
  if (!IsValidStepName(name)) {
    throw std::invalid_argument("a participant's name is 1..32 of [a-z0-9_]: " + name);
  }
  impl_->participants[name] = std::move(options);
  return *this;
}

App& App::Saga(SagaFactory make) {
  if (!make) throw std::invalid_argument("App::Saga: no factory");
  impl_->sagas.push_back(std::move(make));
  return *this;
}

App& App::Option(const std::string& flag, const std::string& help,
                 std::function<void(const std::string& value)> set) {
  if (flag.rfind("--", 0) != 0 || flag.size() < 3) {
    throw std::invalid_argument("App::Option: a long flag such as --tax-rate, not " + flag);
  }
  impl_->flags.push_back({flag, help, std::move(set)});
  return *this;
}

int App::Run(int argc, char** argv) {
  common::TuneAllocator();
  app::BlockStopSignals();
  CLI::App cli{impl_->options.name + ": " + impl_->options.description, impl_->options.name};
  cli.require_subcommand(1);
  // Options of the app (--log-format) may also follow the subcommand.
  cli.fallthrough();
  app::AddLogFormatOption(cli);
  app::Run run;
  app::ClientFlags client_flags;
  for (const auto& add : impl_->commands) add(cli, run);
  app::AddOrchestratorCommand(cli, run, *impl_);
  app::AddAdminCommands(cli, run, *impl_);
  app::AddClientCommands(cli, client_flags, run);
  app::ReadFlagsFromEnvironment(cli);
  try {
    cli.parse(argc, argv);
    // Servers give memory back after a burst; a client command ends before the first run.
    common::Periodic trim("return_free_memory", std::chrono::seconds(2), common::ReturnFreeMemory);
    trim.Start();
    if (run) run();
    return app::ExitCode();
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  } catch (const std::exception& e) {
    std::cerr << impl_->options.name << ": " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace idemsaga
