// The orchestrator's start-up check that every participant keeps its step keys longer than
// this orchestrator may still send them: its own retention plus its longest saga. A key
// collected too early turns a late retry into a second effect, and a late compensation into a
// refund that finds nothing.
//
// Thread-safe once built (the clients are; Run() only reads). Run it before serving or
// recovering: a process that fails it must take over no saga.
//   orchestrator::RetentionCheck check(participants, RequiredParticipantRetention(
//       registry, retry, store_options.retention));
//   check.Run();  // throws std::runtime_error on a participant that keeps its keys too briefly
#pragma once

#include <chrono>

#include "steps/client/participants.hpp"
#include "steps/saga/registry.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator {

// `retention` (how long the orchestrator keeps its parent keys) plus, for the longest saga of
// `registry` under `retry`, every step's deadline twice over (its action and its
// compensation).
std::chrono::seconds RequiredParticipantRetention(const steps::saga::Registry& registry,
                                                  const steps::saga::RetryPolicy& retry,
                                                  std::chrono::seconds retention);

class RetentionCheck {
 public:
  RetentionCheck(const steps::client::Participants& participants, std::chrono::seconds required);

  // Asks each participant how long it keeps its keys (GET the protocol's policy path) and
  // throws std::runtime_error when that is not longer than required(). A participant that
  // does not answer is logged and skipped (it may start after us); one that answers without a
  // retention (a wrong URL or token) throws. Returns how many were checked.
  int Run() const;
  std::chrono::seconds required() const { return required_; }

 private:
  const steps::client::Participants& participants_;
  std::chrono::seconds required_;
};

}  // namespace idemsaga::orchestrator
