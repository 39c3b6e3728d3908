// The stock binary's own commands, beside what every idemsaga::App has: the demo participants
// and `idemsaga dev`.
#pragma once

#include <CLI/CLI.hpp>

#include "app/commands.hpp"

namespace idemsaga::cmd {

// idemsaga inventory|payment|shipping: one demo participant (participant_commands.cpp).
void AddParticipantCommands(CLI::App& app, app::Run& run);
// idemsaga dev: the whole stack on a private PostgreSQL cluster (dev_command.cpp).
void AddDevCommand(CLI::App& app, app::Run& run);

}  // namespace idemsaga::cmd
