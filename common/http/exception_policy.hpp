// The server's exception policy: a handler's exception is answered by what it means (an
// outage a retry can cure, a value the store refused, a defect), as the server's
// common::FailureClassifier says, and logged. The server knows no store: whoever builds it
// gives it the classifier (common/failure.hpp). Internal to common/http (server.hpp is the
// public face: SetFailure, SetUnavailable).
#pragma once

#include <httplib.h>

#include <exception>

#include "common/failure.hpp"

namespace idemsaga::common::http::detail {

// Answers `failure` (SetFailure's answer).
void AnswerFailure(httplib::Response& res, const ClassifiedFailure& failure);

// The one catch point for a handler's exception: `res` is replaced by the answer to what
// `classify` says `ep` means, and the failure is logged.
void AnswerException(const httplib::Request& req, httplib::Response& res,
                     const std::exception_ptr& ep, const FailureClassifier& classify);

}  // namespace idemsaga::common::http::detail
