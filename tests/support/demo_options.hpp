// The orchestrator's options for the demo participants, from the demo's one table
// (demo/stack.hpp): each participant's declared business refusals and the dev service token,
// as the stock binary passes them. No library default supplies them any more.
#pragma once

#include <map>
#include <string>

#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"

namespace test_support {

// `urls`: participant name -> base URL; a demo participant left out is declared without one
// (not called, as shipping in the stock binary).
inline idemsaga::orchestrator::OrchestratorOptions DemoOrchestratorOptions(
    const std::string& database_url, const std::map<std::string, std::string>& urls) {
  idemsaga::orchestrator::OrchestratorOptions o;
  o.database_url = database_url;
  o.service_token = idemsaga::demo::kServiceToken;
  for (const auto& p : idemsaga::demo::kStackParticipants) {
    auto url = urls.find(p.name);
    o.participants[p.name] = {.base_url = url == urls.end() ? "" : url->second,
                              .business_errors = p.business_errors};
  }
  return o;
}

}  // namespace test_support
