// Small string helpers with no better home.
#pragma once

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace idemsaga::common {

// "a, b, c" for Join({"a", "b", "c"}, ", ").
inline std::string Join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.append(separator);
    out.append(parts[i]);
  }
  return out;
}

// ASCII case-insensitive equality (header names, tokens, schemes).
inline bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace idemsaga::common
