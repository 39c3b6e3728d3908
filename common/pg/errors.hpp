// What a failure seen while talking to PostgreSQL means for the caller, by SQLSTATE class
// (PostgreSQL's appendix A), so that every edge answers it the same way:
//   kUnavailable   the database is down, restarting, failing over, overloaded, or unsure
//                  whether a commit landed (class 08, 40, 53, 57P0x, 58, 55P03, 57014,
//                  25006, broken_connection, in_doubt_error, common::Unavailable): a retry with
//                  the same key later is both safe and useful; 503 + Retry-After.
//   kRejectedValue the database refused a value (class 22 data exception, 23 integrity
//                  constraint, 54 program limit): the same request fails the same way for
//                  ever, so it must never be answered "retry". An input that gets here
//                  slipped past the edge's validation, which is a defect to fix there.
//   kDefect        anything else (an undefined table, a syntax error, a bug).
//   switch (pg::Classify(ep).kind) { case pg::Failure::kUnavailable: ...; }
// Classify is PostgreSQL's common::FailureClassifier (common/failure.hpp): what an edge (the
// HTTP server, the guard, the AMQP intake) is given to answer a failure by what it means.
#pragma once

#include <exception>
#include <string>

#include "common/failure.hpp"

namespace idemsaga::common::pg {

using Failure = common::Failure;
using ClassifiedFailure = common::ClassifiedFailure;

// Never throws; `ep` may hold any exception (or none).
ClassifiedFailure Classify(const std::exception_ptr& ep);

// The class of one SQLSTATE alone (exposed for tests).
Failure ClassifySqlState(const std::string& sqlstate);

}  // namespace idemsaga::common::pg
