// A Jepsen-style history of client operations and its checker. Every attempt a client makes
// (POST with an Idempotency-Key) is an `invoke` event followed by its `complete` (an answer,
// with status and body) or its `info` (no answer: a timeout or a broken connection, so the
// client cannot know whether it took effect). After the run the checker reads the history
// against what the databases hold for each key and counts violations by rule:
//   created_without_one_effect  a key answered "completed" (201) without exactly one
//                               reservation held and one charge in force (one row of each)
//   failed_with_net_effect      a key answered "failed" with a reservation still held or a
//                               charge still in force
//   replay_mismatch             a final answer (status and bytes) that differs from the first
//                               final answer of its key
//   divergent_keys              a key that answered two different final answers
//   lost_acks                   a final answer the orchestrator's database does not hold: its
//                               key is not in that end state, or stores other bytes
//   undecided_keys              a key that never got a final answer
//   phantom_effects             a key with a reservation or a charge that no client invoked
//   unmatched_events            an invoke with no complete or info, or an answer to no invoke
// replay_mismatch, lost_acks and unmatched_events count answers or events; the others keys.
// A final answer is one that carries the saga's end ("status": "completed", or a problem with
// "saga_status": "failed"); 202, 409 and 503 are answers that leave the key open.
//
// History is thread-safe (clients record from their own threads; each thread is one client).
//   chaos::History history;  auto op = history.Invoke("demo", key, body);
//   history.Complete(op, 201, answer);  ...  CheckHistory(history.events(), states);
#pragma once

#include <chrono>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace chaos {

struct Event {
  enum class Type { kInvoke, kComplete, kInfo };
  Type type = Type::kInvoke;
  long long op = 0;     // an invoke and its complete or info share it
  int client = 0;       // which client thread
  long long at_us = 0;  // since the history began
  std::string tenant, key;
  std::string body_hash;  // of the request (invoke)
  int status = 0;         // the answer's (complete)
  std::string body;       // the answer's (complete), or why there is none (info)
};

// " a=1 b=2": counts as a figures line prints them.
std::string Counts(std::initializer_list<std::pair<const char*, long long>> counts);

// "completed" or "failed" for a final answer's body; "" for any other.
std::string SagaOutcome(const std::string& body);

class History {
 public:
  History() = default;
  long long Invoke(const std::string& tenant, const std::string& key, const std::string& body);
  void Complete(long long op, int status, std::string body);
  void Info(long long op, std::string why);
  std::vector<Event> events() const;
  // Microseconds since the history began, on the events' clock.
  long long Now() const;

 private:
  Event Append(Event e);  // stamps client and time; holds mutex_
  void Answer(Event e);   // a complete or info: named after its invoke's tenant and key
  int Client();           // holds mutex_

  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::map<std::thread::id, int> clients_;
  std::map<long long, size_t> invoked_;  // op -> its invoke's index in events_
  long long next_op_ = 1;
};

using KeyId = std::pair<std::string, std::string>;  // tenant, idempotency key

// What the databases hold for one key: its row in the orchestrator's key table, and the
// effects its steps left at the participants (rows, and of those the ones still in force).
struct KeyState {
  std::string status;  // the saga's, "" if the key has no row
  int stored_status = 0;
  std::string stored_body;
  int reservation_rows = 0, reservations_held = 0;
  int charge_rows = 0, charges_in_force = 0;  // in force: captured, or authorised (3-D Secure)
};

struct Violations {
  long long created_without_one_effect = 0, failed_with_net_effect = 0, replay_mismatch = 0,
            divergent_keys = 0, lost_acks = 0, undecided_keys = 0, phantom_effects = 0,
            unmatched_events = 0;
  std::vector<std::string> examples;  // the first few, for a failing test's message
  long long Total() const;
  std::string Line() const;  // "violations=N created_without_one_effect=0 ..."
};

Violations CheckHistory(const std::vector<Event>& events, const std::map<KeyId, KeyState>& states);

}  // namespace chaos
