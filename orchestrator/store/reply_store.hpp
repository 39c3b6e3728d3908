// What saga steps over messaging keep in the orchestrator's database (saga_step_replies): the
// commands a step published to a participant's queue, and the first reply to each, until the
// run reads it.
//
// A step writes its command's row (Published) before each publish, then parks; the reply
// consumer stores the first reply that names the row (Answer) and wakes the run when it is
// parked. Each call is one or two autocommitted statements and never spans a network call.
// Thread-safe.
//   ReplyStore replies(pool);
//   replies.Published(tenant, "A", "A-shipping");   // then publish, then park
//   auto r = replies.Find(tenant, "A-shipping");    // at the run's next look
#pragma once

#include <optional>
#include <string>

#include "common/pg/pool.hpp"

namespace idemsaga::orchestrator::store {

struct StepReply {
  int status = 0;
  std::string retry_after;  // as the participant sent it
  std::string body;
  int replies = 0;    // how many replies named the command, duplicates included
  int publishes = 0;  // how many times it was published
};

class ReplyStore {
 public:
  explicit ReplyStore(common::pg::Pool& pool) : pool_(pool) {}

  // sha256 hex of a derived key: what a command's correlation id names it by.
  static std::string Correlation(const std::string& derived_key);

  // Records that the command under `derived_key` of the run `run_key` is about to be
  // published (once more).
  void Published(const std::string& tenant_id, const std::string& run_key,
                 const std::string& derived_key);
  // The reply to the command under `derived_key`, if one came.
  std::optional<StepReply> Find(const std::string& tenant_id, const std::string& derived_key);
  // Forgets a reply that is not the step's for good (anything but a success or a business
  // refusal): the next attempt publishes again, and the participant answers anew.
  void Forget(const std::string& tenant_id, const std::string& derived_key);

  enum class Answered {
    kStored,     // the first reply to the command: the run is to be woken
    kDuplicate,  // the command had its reply already: nothing changed
    kUnknown,    // no such command (its run is gone, or the correlation is not ours)
  };
  // Stores a reply to the command `correlation` of `tenant_id`; `run_key` is set to its run's
  // key (kStored, kDuplicate).
  Answered Answer(const std::string& tenant_id, const std::string& correlation, int status,
                  const std::string& retry_after, const std::string& body, std::string& run_key);
  enum class Woken {
    kWoken,    // it was parked: its lease runs out now, and recovery resumes it
    kRunning,  // a thread runs it (it may be about to park): ask again shortly
    kNot,      // it has ended, or waits as stuck
  };
  Woken Wake(const std::string& tenant_id, const std::string& run_key);

 private:
  common::pg::Pool& pool_;
};

}  // namespace idemsaga::orchestrator::store
