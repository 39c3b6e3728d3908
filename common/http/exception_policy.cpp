#include "common/http/exception_policy.hpp"

#include "common/http/server.hpp"
#include "common/log.hpp"
#include "common/placement.hpp"

namespace idemsaga::common::http {

namespace detail {

void AnswerFailure(httplib::Response& res, const ClassifiedFailure& failure) {
  SetAnswer(res, FailureAnswer(failure));
}

void AnswerException(const httplib::Request& req, httplib::Response& res,
                     const std::exception_ptr& ep, const FailureClassifier& classify) {
  res = httplib::Response();
  try {
    std::rethrow_exception(ep);
  } catch (const Misplaced& e) {
    // Not an outage of this service: the tenant is served elsewhere, or is moving.
    SetAnswer(res, MisplacedAnswer(e));
    return;
  } catch (...) {
  }
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
  SetAnswer(res, UnavailableAnswer(what));
}

}  // namespace idemsaga::common::http
