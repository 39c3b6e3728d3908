// The version of the idemsaga headers a program was compiled with. The rule for what changes
// with which number is in CHANGELOG.md: a release that removes or changes anything declared
// under include/idemsaga/ raises the major version (the minor one while it is 0).
//   static_assert(IDEMSAGA_VERSION_MAJOR == 0 && IDEMSAGA_VERSION_MINOR >= 2);
//
// Part of idemsaga's public API.
#pragma once

#define IDEMSAGA_VERSION_MAJOR 0
#define IDEMSAGA_VERSION_MINOR 2
#define IDEMSAGA_VERSION_PATCH 0

namespace idemsaga {

inline constexpr const char* kVersion = "0.2.0";

}  // namespace idemsaga
