// An orchestrator binary of a team's own: its main() declares the participants its sagas call
// and the sagas, then hands the command line over. The binary then has every subcommand, flag,
// IDEMSAGA_* variable and behaviour of the stock `idemsaga orchestrator`: `orchestrator`
// (migrations with --migrate, the participants' retention check at start-up, recovery, garbage
// collection, the reconcile job, metrics, traces and pages, the AMQP intake with --amqp-url,
// a drain on SIGTERM), `migrate`, `tenant create|list|revoke`, `sagas list|retry|cancel|
// resolve`, `reconcile`, `event`, `trace`, `orders get`. Every saga is served at POST
// /v1/runs/{name} (and over AMQP with the message header `saga: name`), and /openapi.json
// documents each with its input schema (Definition::InputSchema).
//
// Nothing is defaulted for a team: a participant without a URL (here or --participant
// NAME=URL) is not configured, and the service token is required (--service-token or
// IDEMSAGA_SERVICE_TOKEN). One App per process; Run() once.
//   int main(int argc, char** argv) {
//     idemsaga::App app({.name = "trips"});
//     app.Participant("hotel", {.url = "http://127.0.0.1:9001"})
//         .Participant("car", {.business_errors = {"no_cars"}})
//         .Saga(MakeTripSaga);
//     return app.Run(argc, argv);
//   }
//
// The same process can start runs itself (Temporal's client, in process): Start() with a
// saga, a tenant, a key and the input, then Wait() or Poll() on the handle. See below.
//   std::thread serving([&] { app.Run(argc, argv); });
//   app.WaitUntilServing(std::chrono::seconds(30));
//   auto run = app.Start("trip", "acme", "trip-42", {{"city", "Lyon"}});
//   idemsaga::RunResult r = run.Wait(std::chrono::seconds(10));
//   if (r.state == idemsaga::RunResult::State::kCompleted) use(r.output);
//
// Part of idemsaga's public API (CHANGELOG.md says what may change between versions).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "idemsaga/saga.hpp"

namespace idemsaga {

struct AppOptions {
  std::string name = "idemsaga";  // the binary's name, in --help and the logs
  std::string description = "a saga orchestrator with idempotency keys end to end";
};

// A participant as the orchestrator calls it.
struct ParticipantOptions {
  // Its base URL (http://host:port); --participant NAME=URL sets or replaces it. Empty: the
  // participant is not configured, and a saga that needs it is not served.
  std::string url;
  // Its business refusals: the only 4xx error codes that fail a saga for good (compensated,
  // answered to the client). Any other 4xx is a configuration fault: the saga waits, stuck.
  std::set<std::string> business_errors;
};

// What became of a run started in process (App::Start), as far as it is known now.
struct RunResult {
  enum class State {
    kRunning,      // started (by this call or an earlier request with the key); not ended yet
    kCompleted,    // ended with a success answer (2xx): `output` is the saga's answer
    kFailed,       // ended failed, what ran compensated: `output` is the problem it answered
    kInvalid,      // refused: no such saga, or the input or key is not what it takes
    kReused,       // refused: the key was used with another input; nothing else happened
    kUnavailable,  // not known now: not serving (yet), shutting down, or an outage. Nothing
                   // final was stored: Start again with the same key, which is safe
  };
  State state = State::kUnavailable;
  // kCompleted, kFailed: the run's stored answer, as every retry of the key gets it over
  // HTTP or AMQP: its status, its body's bytes, and the body parsed.
  int status = 0;
  std::string body;
  nlohmann::json output;
  bool replayed = false;  // the answer was stored by an earlier request with the key
  std::string detail;     // kInvalid, kUnavailable: why, in a sentence
  std::string trace_id;   // the run's trace (GET /v1/orders/{key}/trace and the pages)
  bool Ended() const { return state == State::kCompleted || state == State::kFailed; }
  // Nothing more will change: ended, or refused for good.
  bool Final() const { return Ended() || state == State::kInvalid || state == State::kReused; }
};

// A run started in process. Copyable; every copy sees the same run. Thread-safe.
class RunHandle {
 public:
  RunHandle() = default;
  // What is known now; never blocks on the run.
  RunResult Poll() const;
  // Waits up to `timeout` for the run to end (or to be refused, or to become unavailable)
  // and returns what is known then (kRunning when the time ran out).
  RunResult Wait(std::chrono::milliseconds timeout) const;
  const std::string& key() const;

  struct State;

 private:
  friend class App;
  std::shared_ptr<State> state_;
};

class App {
 public:
  explicit App(AppOptions options = {});
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // Throws std::invalid_argument for a name that is not 1..32 of [a-z0-9_].
  App& Participant(const std::string& name, ParticipantOptions options = {});
  // Built once at start-up over the configured participants (see SagaFactory).
  App& Saga(SagaFactory make);
  // A flag of the team's own on `orchestrator` (also read from IDEMSAGA_<FLAG>): `set` gets
  // its value before the sagas are built, and throws std::invalid_argument to refuse it.
  App& Option(const std::string& flag, const std::string& help,
              std::function<void(const std::string& value)> set);

  // Parses the command line and runs the subcommand; returns the process's exit code (0,
  // 1 on an error it printed, 2 for a usage error, as CLI tools do).
  int Run(int argc, char** argv);

  // The in-process client, for the team's own code in this process while Run() serves the
  // `orchestrator` command on another thread: starts a run of the latest version of `saga`
  // for `tenant` (an existing tenant) under the idempotency key `key`, exactly as POST
  // /v1/runs/{saga} with that key and `input` as its body does (one key sent both ways is
  // one run, with one answer, byte for byte). Returns at once; the run starts on a thread of
  // the client's. Before the orchestrator is serving (or once it stops), the handle's result
  // is kUnavailable and nothing is stored: WaitUntilServing() first.
  RunHandle Start(const std::string& saga, const std::string& tenant, const std::string& key,
                  nlohmann::json input);
  // True once Run() serves the `orchestrator` command (migrations done, port bound), within
  // `timeout`; false when it did not (or has stopped).
  bool WaitUntilServing(std::chrono::milliseconds timeout);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend Impl& AppImpl(App& app);
};

}  // namespace idemsaga
