// The "deliver an external event" use case: one typed call behind every way an event comes
// in (POST /v1/runs/{saga}/{key}/events/{name}, the AMQP events queue). It finds the run and
// the step that awaits the event, checks the payload with the saga's parser, and stores the
// event under its own Idempotency-Key (EventStore), or replays what that key stored. No wire
// format in it: the adapters authenticate the caller, read the event's key and JSON payload
// off their wire, and render the EventOutcome their own way (orchestrator/http/answers.hpp).
//
// In two calls, so that an adapter refuses in the order it always has: Find (the run, the
// event), then the adapter reads the key and payload, then Deliver.
//
// Thread-safe (the stores are). Throws what the stores throw (an outage).
//   EventReceiver events(event_store, registry, parent_store);
//   auto target = events.Find({.tenant_id = t, .saga = "trip", .run_key = "k1", .event = "paid"});
//   if (target.Found()) outcome = events.Deliver(target, event_key, payload);
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/idempotency_key.hpp"
#include "orchestrator/saga_service.hpp"
#include "orchestrator/store/event_store.hpp"
#include "orchestrator/store/parent_store.hpp"
#include "steps/saga/registry.hpp"

namespace idemsaga::orchestrator {

struct EventRequest {
  std::string tenant_id;  // who asks (the adapter authenticated it)
  std::string saga;       // the run's saga, as the caller names it
  std::string run_key;    // the run's Idempotency-Key, its bytes
  std::string event;      // the event's name
};

struct EventOutcome {
  enum class Kind {
    kStored,           // delivered now: `status`, `body` are the stored answer
    kReplayed,         // delivered before under this key: the stored answer
    kInvalidRunKey,    // the run's key is not a key: nothing stored
    kNoRun,            // no run of the tenant under that key
    kOtherSaga,        // the key's run is another saga's
    kNotExpected,      // the run awaits no such event (`detail` lists what it awaits)
    kInvalid,          // the saga's parser refused the payload (`detail`)
    kReused,           // the event's key delivered this event with another payload
    kAlreadyReceived,  // the run has the event from a delivery under another key
    kNotAccepted,      // the run takes the event no more (`detail`)
  };
  Kind kind = Kind::kNoRun;
  std::string detail;
  int status = 0;  // kStored, kReplayed
  std::string body;
  std::string saga;  // the run's (kStored, kReplayed)
  std::string run_key;
  // What the event's key said: kClaimed (stored), kReplayed, kMismatch (reused), kNone for a
  // refusal with nothing stored.
  KeyOutcome Key() const;
};

class EventReceiver {
 public:
  EventReceiver(store::EventStore& events, const steps::saga::Registry& registry,
                store::ParentStore& store)
      : events_(events), registry_(registry), store_(store) {}

  struct Target {
    std::optional<store::SagaRow> run;
    const steps::saga::StepDefinition* step = nullptr;  // the step that awaits the event
    std::string event;
    EventOutcome refused;  // when not Found()
    bool Found() const { return step != nullptr; }
  };
  // The run and its step that await `request`'s event, or why there are none.
  Target Find(const EventRequest& request) const;
  // Stores (or replays) the event of a found `target` under `event_key` (1..200 printable
  // ASCII, checked by the adapter).
  EventOutcome Deliver(const Target& target, const std::string& event_key,
                       const nlohmann::json& payload) const;

 private:
  store::EventStore& events_;
  const steps::saga::Registry& registry_;
  store::ParentStore& store_;
};

}  // namespace idemsaga::orchestrator
