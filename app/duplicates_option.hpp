// --duplicates wait|fail-fast, the one flag for a participant's duplicate policy: in the
// library's Participant::Run and the stock participants' commands alike.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace idemsaga::app {

inline void AddDuplicatesOption(CLI::App* cmd, std::string& duplicates) {
  cmd->add_option("--duplicates", duplicates,
                  "a request whose key a concurrent duplicate holds: wait for it and replay its "
                  "answer, or fail-fast with 409 + Retry-After (an advisory lock)")
      ->check(CLI::IsMember({"wait", "fail-fast"}))
      ->capture_default_str();
}

}  // namespace idemsaga::app
