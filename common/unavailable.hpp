// A store the request needs (a database, a cache, a broker) cannot be reached or cannot take
// the work now. Thrown by the clients of those stores; every edge answers it as an outage
// (503 + Retry-After: a retry with the same key later is safe). Derive a store's own
// "unavailable" from it instead of inventing another answer for it.
#pragma once

#include <stdexcept>

namespace idemsaga::common {

class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace idemsaga::common
