// RFC 3986 percent-encoding of everything but unreserved characters: safe in a URL path
// segment and in a query value. Pure function.
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace idemsaga::common {

inline std::string PercentEncode(std::string_view v) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : v) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

}  // namespace idemsaga::common
