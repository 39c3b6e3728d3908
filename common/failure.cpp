#include "common/failure.hpp"

#include "common/unavailable.hpp"

namespace idemsaga::common {

ClassifiedFailure ClassifyPlain(const std::exception_ptr& ep) {
  ClassifiedFailure out;
  if (!ep) return out;
  try {
    std::rethrow_exception(ep);
  } catch (const Unavailable& e) {
    out = {Failure::kUnavailable, "", e.what()};
  } catch (const std::exception& e) {
    out = {Failure::kDefect, "", e.what()};
  } catch (...) {
    out = {Failure::kDefect, "", "unknown exception"};
  }
  return out;
}

}  // namespace idemsaga::common
