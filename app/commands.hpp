// The `idemsaga` subcommands. Each Add function adds its subcommand(s) with flags of their own;
// the chosen subcommand's callback sets `run`, which main() calls once parsing has succeeded.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "idemsaga/app.hpp"

namespace idemsaga::app {

using Run = std::function<void()>;

// orchestrator: the coordinator service, serving `setup`'s sagas (orchestrator_command.cpp).
void AddOrchestratorCommand(CLI::App& app, Run& run, const idemsaga::App::Impl& setup);
// migrate, tenant create and reconcile (admin_commands.cpp).
void AddAdminCommands(CLI::App& app, Run& run, const idemsaga::App::Impl& setup);

// tenant place and tenant move, under `tenant` (placement_commands.cpp).
void AddTenantPlacementCommands(CLI::App* tenant, Run& run);

// --otlp-header "Name: value", repeatable: exactly what a service's exporter sends to the
// collector, and ParseHeaders of what was given.
void AddOtlpHeaderOption(CLI::App* cmd, std::vector<std::string>& headers);
std::map<std::string, std::string> ParseHeaders(const std::vector<std::string>& headers);

// What main() returns once the command has run: 0, or what the command set (a client command
// that got an error status: 1; reconcile: 1 or 2).
int ExitCode();
void SetExitCode(int code);

// --participant NAME=URL: the base URL of the participant sagas call by NAME ("" when valid).
std::string CheckParticipantFlag(const std::string& value);
// A duration flag such as 90s, 30m, 1h or 2d ("" when valid).
std::string CheckDuration(const std::string& value);

// Twelve-factor configuration: every long flag of `app` and its subcommands that names no
// variable of its own reads IDEMSAGA_<FLAG> (--lease-seconds: IDEMSAGA_LEASE_SECONDS) when
// it is not given on the command line. Call once every subcommand is added.
void ReadFlagsFromEnvironment(CLI::App& app);

// --log-format text|json on `app` (and, by fallthrough, after any subcommand).
void AddLogFormatOption(CLI::App& app);

}  // namespace idemsaga::app
