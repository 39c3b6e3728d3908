#include "orchestrator/retention_check.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/log.hpp"
#include "steps/protocol/participant_protocol.hpp"

namespace idemsaga::orchestrator {

std::chrono::seconds RequiredParticipantRetention(const steps::saga::Registry& registry,
                                                  const steps::saga::RetryPolicy& retry,
                                                  std::chrono::seconds retention) {
  std::chrono::milliseconds longest{0};
  for (const auto* def : registry.All()) {
    longest = std::max(longest, 2 * steps::saga::LongestRun(retry, *def));
  }
  return retention + std::chrono::ceil<std::chrono::seconds>(longest);
}

RetentionCheck::RetentionCheck(const steps::client::Participants& participants,
                               std::chrono::seconds required)
    : participants_(participants), required_(required) {}

int RetentionCheck::Run() const {
  int checked = 0;
  for (auto [name, client] : participants_.All()) {
    std::string error;
    int status = 0;
    auto policy = client->GetJson(steps::protocol::kPolicyPath, error, status);
    if (status == 0) {
      // Not up yet (participants may start after us): nothing to compare, nothing wrong.
      common::Log("retention_unchecked", {{"participant", client->base_url()}, {"error", error}});
      continue;
    }
    // A wrong token or URL (401, 404) is a misconfiguration the check must not hide.
    if (!policy || !policy->is_object() || !policy->contains("key_retention_seconds") ||
        !(*policy)["key_retention_seconds"].is_number_integer()) {
      throw std::runtime_error("participant " + client->base_url() + steps::protocol::kPolicyPath +
                               " did not say how long it keeps keys (" + error +
                               "); check its URL and the service token");
    }
    std::chrono::seconds kept((*policy)["key_retention_seconds"].get<long long>());
    if (kept <= required_) {
      throw std::runtime_error(
          "participant " + client->base_url() + " keeps idempotency keys for " +
          std::to_string(kept.count()) + " s, but this orchestrator needs more than " +
          std::to_string(required_.count()) +
          " s (its --retention-hours plus its longest saga): a late retry or compensation could "
          "find a step key gone. Raise the participant's retention or lower this one's.");
    }
    ++checked;
  }
  return checked;
}

}  // namespace idemsaga::orchestrator
