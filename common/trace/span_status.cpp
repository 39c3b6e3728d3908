#include "common/trace/span_status.hpp"

namespace idemsaga::common::trace {

RequestEnd RequestEndOf(int http_status, bool stored_outcome) {
  if (http_status >= 500) return RequestEnd::kFailed;
  if (http_status < 400 || stored_outcome) return RequestEnd::kServed;
  if (http_status == 409 || http_status == 429) return RequestEnd::kComeBack;
  return RequestEnd::kRefused;
}

void EndRequestSpan(Span& span, RequestEnd end, const std::string& error_name) {
  if (IsSpanError(end)) {
    span.Error(error_name);
  } else {
    span.Ok();
  }
}

void EndRequestSpan(Span& span, int http_status, bool stored_outcome) {
  span.Set("http.status_code", static_cast<long long>(http_status));
  EndRequestSpan(span, RequestEndOf(http_status, stored_outcome),
                 "HTTP " + std::to_string(http_status));
}

void EndWorkSpan(Span& span, int http_status, const std::string& refusal_name) {
  span.Set("http.status_code", static_cast<long long>(http_status));
  if (http_status >= 400) {
    span.Error(refusal_name);
  } else {
    span.Ok();
  }
}

}  // namespace idemsaga::common::trace
