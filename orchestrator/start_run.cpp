#include "orchestrator/start_run.hpp"

#include "common/crypto.hpp"
#include "common/log.hpp"
#include "common/trace/span_status.hpp"
#include "common/trace/trace_context.hpp"
#include "orchestrator/run_outcomes.hpp"

namespace idemsaga::orchestrator {
namespace {

RunOutcome Refused(RunOutcome::Kind kind, std::string detail) {
  RunOutcome o;
  o.kind = kind;
  o.detail = std::move(detail);
  return o;
}

const char* RefusalName(RunOutcome::Kind kind) {
  switch (kind) {
    case RunOutcome::Kind::kInProgress:
      return "in progress";
    case RunOutcome::Kind::kReused:
      return "key reused";
    case RunOutcome::Kind::kInvalid:
      return "invalid input";
    case RunOutcome::Kind::kUnknownSaga:
      return "unknown saga";
    case RunOutcome::Kind::kUnavailable:
      return "unavailable";
    default:
      return "internal error";
  }
}

// How a request without a final answer ended, for its span (the rule:
// common/trace/span_status.hpp). A refusal has no HTTP status here (each adapter words it), so
// it is classed by its kind.
common::trace::RequestEnd EndOf(RunOutcome::Kind kind) {
  using End = common::trace::RequestEnd;
  switch (kind) {
    case RunOutcome::Kind::kRunning:
      return End::kServed;
    case RunOutcome::Kind::kInProgress:
      return End::kComeBack;
    case RunOutcome::Kind::kReused:
    case RunOutcome::Kind::kInvalid:
    case RunOutcome::Kind::kUnknownSaga:
      return End::kRefused;
    default:
      return End::kFailed;
  }
}

// Records on the request's span how it ended, and hands the outcome on.
RunOutcome Ended(common::trace::Span& span, RunOutcome o) {
  o.traceparent = common::trace::FormatTraceparent(span.context().trace_id, span.context().span_id);
  if (o.Final()) {
    // The saga's stored answer: a business failure is the saga span's error, not this one's.
    common::trace::EndRequestSpan(span, o.answer.status, /*stored_outcome=*/true);
  } else {
    // Named by kind, never by `detail`: a refusal's detail can quote the client's own bytes,
    // and spans are stored.
    common::trace::EndRequestSpan(span, EndOf(o.kind), RefusalName(o.kind));
  }
  return o;
}

}  // namespace

RunOutcome RunStarter::Start(const RunRequest& r) const { return *Run(r, false); }

// A replay of a retry storm between two traced ones: answered and counted as the traced ones
// are, with no span or log line of its own (the next traced replay counts it). Its traceparent
// names the caller's trace when it sent one, as a traced replay's would, else the run's root
// span, where a traced replay's own span would have joined.
RunOutcome RunStarter::Untraced(const steps::saga::Definition& definition, const RunRequest& r,
                                std::shared_ptr<const std::any> input, std::string request_hash,
                                store::FinishedAnswer answer) const {
  common::trace::SpanContext names{answer.trace_id, answer.root_span_id};
  if (auto caller = common::trace::ParseTraceparent(r.traceparent)) {
    names = {caller->trace_id, caller->parent_id};
  }
  store::ClaimRequest request{
      .tenant_id = r.tenant_id, .key = r.key, .request_hash = std::move(request_hash)};
  Submission s{&definition, std::move(input), std::move(request)};
  s.replay = std::move(answer);
  RunOutcome outcome = sagas_.Submit(s);
  outcome.traceparent = common::trace::FormatTraceparent(names.trace_id, names.span_id);
  return outcome;
}

std::optional<RunOutcome> RunStarter::Replay(const RunRequest& r) const { return Run(r, true); }

std::optional<RunOutcome> RunStarter::Run(const RunRequest& r, bool replay_only) const {
  // The path the request's fingerprint is scoped by, as the HTTP routes have always named it:
  // a fingerprint is stored with every key, so it must not change with the adapter.
  const std::string route = r.as_order ? "/v1/orders" : "/v1/runs/" + r.saga;
  const steps::saga::Definition* definition = registry_.Latest(r.as_order ? kOrderSaga : r.saga);
  if (definition == nullptr) {
    if (replay_only) return std::nullopt;
    return Refused(RunOutcome::Kind::kUnknownSaga, "no saga of this name is served here");
  }
  if (!common::IsValidKeyBytes(r.key, kMaxParentKeyLength)) {
    if (replay_only) return std::nullopt;
    return Refused(RunOutcome::Kind::kInvalid, "the Idempotency-Key must be 1-" +
                                                   std::to_string(kMaxParentKeyLength) +
                                                   " printable ASCII characters");
  }
  std::string request_hash = common::RequestFingerprint("POST", route, r.input);
  std::optional<store::FinishedAnswer> replay;
  store::ReplaySample sample;
  std::shared_ptr<const std::any> input;
  if (replay_only) {
    // Decided before the span starts: a request handed on to Start leaves no trace here (and
    // its input is parsed there, once: every first request passes through here).
    replay = sagas_.CachedAnswer(r.tenant_id, r.key, request_hash, sample);
    if (!replay) return std::nullopt;
    // A row stored without a root span (before V002) is traced as it always was; an input the
    // saga refuses is refused below, traced.
    if (!sample.trace && !replay->trace_id.empty() && !replay->root_span_id.empty()) {
      try {
        input = definition->ParseInput(r.input);
      } catch (const steps::saga::InvalidInput&) {
        input = nullptr;  // refused below
      }
      if (input) {
        return Untraced(*definition, r, std::move(input), std::move(request_hash),
                        std::move(*replay));
      }
    }
  }
  // A caller's trace is continued; otherwise this request starts the saga's trace.
  auto caller = common::trace::ParseTraceparent(r.traceparent);
  common::trace::SpanContext parent;
  if (caller) parent = {caller->trace_id, caller->parent_id};
  auto span = tracer_.Start(r.span_name.empty() ? "start " + definition->name() : r.span_name,
                            parent, common::trace::SpanKind::kServer);
  span.Set("tenant", r.tenant_id).Set("idempotency_key", r.key);
  const std::string traceparent =
      common::trace::FormatTraceparent(span.context().trace_id, span.context().span_id);
  try {
    if (!input) input = definition->ParseInput(r.input);
  } catch (const steps::saga::InvalidInput& e) {
    return Ended(span, Refused(RunOutcome::Kind::kInvalid, e.what()));
  }
  // The route is in the fingerprint: one key sent to two sagas is a reuse (422).
  store::ClaimRequest request{.tenant_id = r.tenant_id,
                              .key = r.key,
                              .request_hash = std::move(request_hash),
                              .request_body = r.input,
                              .trace_id = span.context().trace_id,
                              .root_span_id = span.context().span_id};
  Submission s{definition, std::move(input), std::move(request)};
  s.replay = std::move(replay);
  if (r.answer_early) {
    // The saga's "still running" when it outlives the response budget, or its answer later;
    // the saga's own span is this request's, so the traceparent is already known.
    s.answer_early = [send = r.answer_early, traceparent](const RunOutcome& o) {
      RunOutcome later = o;
      later.traceparent = traceparent;
      return send(later);
    };
  }
  RunOutcome outcome;
  try {
    outcome = sagas_.Submit(s);
  } catch (...) {
    // Every adapter answers what escapes with a 5xx (its exception policy): the server failed.
    common::trace::EndRequestSpan(span, common::trace::RequestEnd::kFailed, "not answered");
    throw;
  }
  span.Set("idempotency.outcome", std::string(ToString(outcome.outcome)))
      .Set("replayed", outcome.outcome == KeyOutcome::kReplayed);
  if (sample.untraced_before > 0) span.Set("replays.untraced_before", sample.untraced_before);
  // Deferred: its span records what it would be at the latest, the saga's own span what it
  // became.
  if (outcome.deferred) return Ended(span, std::move(outcome));
  // A request that starts or resumes the saga is logged by it (saga_started, saga_resumed);
  // one line per request, not two.
  if (!outcome.Owns()) {
    common::Log(
        "saga_request",
        {{"tenant", r.tenant_id},
         {"key", r.key},
         {"saga", definition->name()},
         {"outcome", ToString(outcome.outcome)},
         {"http_status", outcome.Final() ? std::to_string(outcome.answer.status) : ""},
         {"untraced_replays_before", std::to_string(sample.untraced_before)},
         {"trace_id", outcome.trace_id.empty() ? span.context().trace_id : outcome.trace_id}});
  }
  // A retry that did not start the saga joins the saga's trace (unless the caller has a
  // trace of its own), so the replay shows in its waterfall.
  if (!outcome.Owns() && !caller && !outcome.trace_id.empty()) {
    span.Reparent({outcome.trace_id, outcome.root_span_id});
  }
  return Ended(span, std::move(outcome));
}

}  // namespace idemsaga::orchestrator
