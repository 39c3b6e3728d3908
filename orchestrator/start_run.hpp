// The "start a run" use case: one typed call behind every way a run is started (POST
// /v1/orders and /v1/runs/{saga}, the AMQP intake, the in-process idemsaga::App::Start). It
// finds the saga, parses its input, fingerprints the request, opens the request's span (the
// root of the run's trace when it starts the run), claims the key and runs or replays the
// saga through SagaService. No wire format in it: the adapters authenticate the caller, read
// the key and the JSON off their wire, and render the RunOutcome (saga_service.hpp) their own
// way; a finished run's stored answer is the one thing every adapter hands on byte for byte.
//
// Thread-safe (SagaService is); Start blocks up to the response budget unless
// `answer_early` is set. Throws what the store throws (an outage, a tenant that does not
// exist): the adapter answers it as it answers any failure.
//   RunStarter runs(sagas, registry, tracer);
//   RunOutcome o = runs.Start({.saga = "trip", .tenant_id = "acme", .key = "k1", .input = j});
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/idempotency_key.hpp"
#include "common/trace/span.hpp"
#include "orchestrator/saga_service.hpp"
#include "steps/saga/registry.hpp"

namespace idemsaga::orchestrator {

// Parent keys may be 1..200 printable ASCII; a saga's steps add at most steps::saga::kMaxKeySuffix.
inline constexpr size_t kMaxParentKeyLength = 200;
static_assert(kMaxParentKeyLength + steps::saga::kMaxKeySuffix <= common::kMaxDerivedKeyLength);

struct RunRequest {
  std::string saga;       // a served saga's name: its latest version starts
  std::string tenant_id;  // who asks (the adapter authenticated it)
  std::string key;        // the Idempotency-Key's bytes: 1..kMaxParentKeyLength printable ASCII
  nlohmann::json input;   // the run's input, as the saga's Definition parses it
  // The caller's W3C traceparent ("" for none): the run's trace continues the caller's.
  std::string traceparent;
  // Started as an order (POST /v1/orders, an AMQP message without a `saga` header): the
  // order saga, fingerprinted as an order, as every key stored so far was. A key sent as an
  // order and again as /v1/runs/place_order is two requests (422), as it has always been.
  bool as_order = false;
  // The name of the request's span: "POST /v1/orders" for HTTP; "" for "start <saga>".
  std::string span_name;
  // See Submission::answer_early: an adapter that can answer later from another thread.
  std::function<bool(const RunOutcome&)> answer_early;
};

class RunStarter {
 public:
  RunStarter(SagaService& sagas, const steps::saga::Registry& registry,
             const common::trace::Tracer& tracer)
      : sagas_(sagas), registry_(registry), tracer_(tracer) {}

  // What became of `request` (kUnknownSaga, kInvalid before anything is stored). The outcome
  // carries the request span's traceparent, for the adapter to hand back.
  RunOutcome Start(const RunRequest& request) const;
  // Start, for a request that replays a finished key whose answer is in memory: the same
  // outcome, span and log line, with no database and no wait (an adapter may call it on an
  // event loop). A key's replays in a retry storm are traced and logged one a second, each
  // counting the ones answered since (store::ReplaySample). nullopt when it is anything else:
  // the adapter then calls Start.
  std::optional<RunOutcome> Replay(const RunRequest& request) const;
  // Whether a saga of this name is served (Start answers kUnknownSaga otherwise): for an
  // adapter that tells which sagas are served only to a caller it knows.
  bool Serves(std::string_view saga) const { return registry_.Latest(saga) != nullptr; }

 private:
  std::optional<RunOutcome> Run(const RunRequest& request, bool replay_only) const;
  RunOutcome Untraced(const steps::saga::Definition& definition, const RunRequest& request,
                      std::shared_ptr<const std::any> input, std::string request_hash,
                      store::FinishedAnswer answer) const;

  SagaService& sagas_;
  const steps::saga::Registry& registry_;
  const common::trace::Tracer& tracer_;
};

}  // namespace idemsaga::orchestrator
