// Small string helpers with no better home.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace common {

// "a, b, c" for Join({"a", "b", "c"}, ", ").
inline std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.append(separator);
    out.append(parts[i]);
  }
  return out;
}

}  // namespace common
