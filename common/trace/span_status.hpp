// When a span is an error: the one rule, for every service and every edge (docs/traces.md).
//
// A request span (SpanKind::kServer: an order's POST, a participant's guarded route) says
// whether the server served the request, not whether the business said yes. It is an ERROR
// when
//   - the server failed: any 5xx (an outage, a defect, a saga whose participant failed, 502),
//     whether answered now or replayed; or
//   - the request itself was refused: malformed (400, 411, 414, 431), unauthorized (401, 403),
//     unknown (404, 405), too large or of a type not taken (413, 415), too slow (408), not
//     acceptable as sent (422: a key reused with another body, an input the saga does not
//     take), or any other 4xx the edge answered about the request.
// It is OK otherwise: 1xx-3xx (202 "still running" among them); 409 and 429, which answer a
// well-formed request with the state of its key or of its tenant (in progress: come back; a
// tombstone; too many running); and any answer that is the stored outcome of the work, replayed
// or not (a declined payment's 402, an unserviceable address's 422, a failed saga's stored 4xx).
// Such a refusal is the system working: the span of the work itself records it.
//
// A work span (a participant's business effect; the saga and step spans say the same through
// their StepResult) is an ERROR when the work refused or failed: any answer >= 400.
//
// Error names are the kind of ending ("HTTP 422", "key reused"), never the client's bytes:
// spans are stored and shown to operators (unstorable_text_itest).
//
// RequestEndOf is pure; the End* functions set the status of the span they are given, which
// belongs to one thread (span.hpp).
//   EndRequestSpan(span, res.status, /*stored_outcome=*/answer_was_stored);
#pragma once

#include <string>

#include "common/trace/span.hpp"

namespace idemsaga::common::trace {

// How a request ended, for its span.
enum class RequestEnd {
  kServed,    // answered with what the service did, stored or replays (OK)
  kComeBack,  // 409 / 429: the key or the tenant is busy or settled otherwise (OK)
  kRefused,   // the request itself was refused (ERROR)
  kFailed,    // the server, or what it depends on, failed (ERROR)
};

// `stored_outcome`: the answer is what the work stored as its result (first sent or replayed),
// not one the edge made up about the request.
RequestEnd RequestEndOf(int http_status, bool stored_outcome);

constexpr bool IsSpanError(RequestEnd end) {
  return end == RequestEnd::kRefused || end == RequestEnd::kFailed;
}

// The request span's status by the rule; an error is named `error_name`.
void EndRequestSpan(Span& span, RequestEnd end, const std::string& error_name);
// The same for an answered request: sets http.status_code; an error is named "HTTP <status>".
void EndRequestSpan(Span& span, int http_status, bool stored_outcome);

// A work span's status by the rule: sets http.status_code; an answer >= 400 is an error
// named `refusal_name`.
void EndWorkSpan(Span& span, int http_status, const std::string& refusal_name);

}  // namespace idemsaga::common::trace
