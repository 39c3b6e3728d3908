#include "common/failure.hpp"

#include <atomic>

#include "common/unavailable.hpp"

namespace common {

namespace {

std::atomic<FailureClassifierFn> installed{nullptr};

}  // namespace

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

ClassifiedFailure ClassifyFailure(const std::exception_ptr& ep) {
  auto classify = installed.load(std::memory_order_acquire);
  return classify != nullptr ? classify(ep) : ClassifyPlain(ep);
}

void InstallFailureClassifier(FailureClassifierFn classify) {
  installed.store(classify, std::memory_order_release);
}

}  // namespace common
