// External events delivered to saga runs, in the orchestrator's database (saga_events).
//
// Each (run, event name) is delivered once: the first delivery is stored with its own
// Idempotency-Key, fingerprint and answer; a retry of it replays that answer, anything else
// is refused. A delivery wakes the run when it is parked waiting for that event (see
// ParentStore::ParkForEvents for why no delivery is missed). Each call is one or two
// autocommitted statements and never spans a network call. Thread-safe.
//   EventStore events(pool);
//   auto d = events.Deliver({tenant, run_key, "payment_confirmed", event_key, hash, payload,
//                            202, body});
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/pg/pool.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator::store {

struct EventDelivery {
  std::string tenant_id;
  std::string run_key;
  std::string name;
  std::string event_key;                 // the delivery's own Idempotency-Key
  std::string request_hash;              // common::RequestFingerprint of the delivery
  std::vector<std::string> wait_events;  // every event of the wait that awaits this one
  nlohmann::json payload;
  int response_status = 202;  // the answer to store and replay
  std::string response_body;
};

struct Delivered {
  enum Kind {
    kStored,           // this request delivered it
    kReplayed,         // a retry of the delivery: the stored answer
    kKeyReused,        // the event's key was sent before with another payload (422)
    kAlreadyReceived,  // the run has this event from another delivery (409)
    kNotAccepted,      // the run is not running its actions, or its wait took another (409)
  };
  Kind kind = kNotAccepted;
  int response_status = 0;  // kStored, kReplayed
  std::string response_body;
};

class EventStore {
 public:
  explicit EventStore(common::pg::Pool& pool) : pool_(pool) {}

  // `accepting`: whether the run may take the event now (the route checked); when not, only
  // a retry of a delivery made before is answered (replayed), and nothing is stored.
  Delivered Deliver(const EventDelivery& delivery, bool accepting);
  // What the run's wait for `names` takes: the event it took before (whoever ran it then),
  // else the first delivered, from now on taken (a later delivery of the wait's other events
  // is refused). Call it under the run's lease.
  std::optional<steps::saga::ReceivedEvent> Take(const std::string& tenant_id,
                                                 const std::string& run_key,
                                                 const std::vector<std::string>& names);

 private:
  common::pg::Pool& pool_;
};

}  // namespace idemsaga::orchestrator::store
