#include "common/http/exception_policy.hpp"

#include "common/http/server.hpp"
#include "common/log.hpp"

namespace common::http {

namespace detail {

void AnswerFailure(httplib::Response& res, const ClassifiedFailure& failure) {
  switch (failure.kind) {
    case Failure::kUnavailable:
      SetUnavailable(res, "the database is unavailable");
      break;
    case Failure::kRejectedValue:
      // Not an outage: the same request would fail the same way, so no Retry-After and no
      // promise that a retry helps. Nothing was stored (the transaction rolled back).
      SetError(res, 500, "internal_error",
               "the database refused a value of this request (SQLSTATE " + failure.sqlstate +
                   "); nothing was stored, and sending it again fails the same way");
      break;
    case Failure::kDefect:
      SetError(res, 500, "internal_error", "internal error; retrying with the same key is safe");
      break;
  }
}

void AnswerException(const httplib::Request& req, httplib::Response& res,
                     const std::exception_ptr& ep, const FailureClassifier& classify) {
  res = httplib::Response();
  auto failure = classify(ep);
  AnswerFailure(res, failure);
  const char* event = failure.kind == Failure::kUnavailable     ? "handler_database_unavailable"
                      : failure.kind == Failure::kRejectedValue ? "handler_value_rejected"
                                                                : "handler_exception";
  Log(event, {{"method", req.method},
              {"path", req.path},
              {"sqlstate", failure.sqlstate},
              {"error", failure.what}});
}

}  // namespace detail

ClassifiedFailure SetFailure(httplib::Response& res, const std::exception_ptr& ep,
                             const FailureClassifier& classify) {
  auto failure = classify(ep);
  detail::AnswerFailure(res, failure);
  return failure;
}

void SetUnavailable(httplib::Response& res, const std::string& what) {
  SetError(res, 503, "unavailable", what + "; retrying with the same key is safe");
  res.set_header("Retry-After", "1");
}

}  // namespace common::http
