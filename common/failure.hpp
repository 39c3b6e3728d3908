// What a failure means for whoever answers it, whatever failed (a database, a cache, a
// broker): the seam between the stores, which know their errors, and the edges (the HTTP
// server, the guard, the AMQP intake), which answer by meaning alone.
//   kUnavailable   an outage a retry with the same key later can cure (503 + Retry-After)
//   kRejectedValue the store refused a value: the same request fails the same way for ever
//   kDefect        anything else (a bug)
// A store's classifier says which (common/pg/errors.hpp for PostgreSQL's SQLSTATEs). Without
// one, common::Unavailable is an outage and anything else a defect (ClassifyPlain).
//
// There is no process-wide classifier: each edge is given the one for the stores behind it by
// whoever builds it (its composition root), so no global state decides an answer.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace idemsaga::common {

enum class Failure { kUnavailable, kRejectedValue, kDefect };

struct ClassifiedFailure {
  Failure kind = Failure::kDefect;
  std::string sqlstate;  // the store's own code for it (a SQLSTATE); "" when it carried none
  std::string what;
};

// Says what an exception means. Must not throw; `ep` may hold any exception (or none).
using FailureClassifier = std::function<ClassifiedFailure(const std::exception_ptr&)>;

// common::Unavailable is an outage, anything else a defect.
ClassifiedFailure ClassifyPlain(const std::exception_ptr& ep);

}  // namespace idemsaga::common
