// JSON written as text, for hot paths where a document (nlohmann::json) would first copy every
// value into a tree of maps: the span pipeline encodes thousands of spans a second, and those
// trees were most of the server's peak heap.
//   std::string out = "{\"name\":";
//   common::json::AppendString(out, name);
#pragma once

#include <string>
#include <string_view>

namespace idemsaga::common::json {

// Appends `s` as a JSON string, quotes included. Bytes that are not UTF-8 become U+FFFD (as
// nlohmann's error_handler_t::replace does), so the result always parses.
void AppendString(std::string& out, std::string_view s);

}  // namespace idemsaga::common::json
