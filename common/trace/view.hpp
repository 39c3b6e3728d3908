// Traces as the API and the CLI show them: spans as JSON, which participant spans are still on
// their way, and the terminal waterfall. Pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/trace/span.hpp"

namespace idemsaga::common::trace {

nlohmann::json SpanJson(const SpanData& s);

// Step attempts that got an HTTP answer from a participant whose own spans have not arrived
// yet (a participant exports in the background, a moment after it answers).
std::vector<std::string> PendingSpans(const std::vector<SpanData>& spans);

// An order's trace (the JSON of GET /v1/orders/{key}/trace) as a terminal waterfall: tree
// indentation, service, span name with its markers (derived key, attempt, HTTP status,
// replayed, guard outcome, compensation), duration, a bar scaled to the trace, and status.
std::string RenderWaterfall(const nlohmann::json& trace, int bar_width = 40);

}  // namespace idemsaga::common::trace
