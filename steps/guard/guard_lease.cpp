// detail::CallUnderLease: the call out and the fenced record of its answer, shared by the
// key-value stores (redis_guard.cpp, dynamo_guard.cpp).
#include <thread>

#include "common/log.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard::detail {

Response CallUnderLease(const Request& req, long long token, bool earlier,
                        std::chrono::seconds lease,
                        const std::function<Response(const ExternalCall&)>& call,
                        const std::function<void()>& release,
                        const std::function<Response(const Response&)>& record) {
  using Clock = std::chrono::steady_clock;
  const auto lease_end = Clock::now() + lease;
  if (earlier) {
    common::Log(
        "guard_takeover",
        {{"tenant", req.tenant_id}, {"key", req.key}, {"fencing_token", std::to_string(token)}});
  }
  Response res;
  try {
    res = call(ExternalCall{req, token, earlier, lease_end - lease / 4});
  } catch (const NotSent&) {
    // Certainly not sent: the next request may take over at once.
    try {
      release();
    } catch (const std::exception&) {
      // The lease runs out on its own.
    }
    throw;
  }
  // Any other exception may have reached the third party: the claim stays until its lease
  // runs out, so a retry cannot overtake it with a second call.
  if (res.status >= 500) {
    throw std::runtime_error("the external effect answered " + std::to_string(res.status) +
                             "; nothing stored");
  }
  res.replayed = false;
  res.outcome = protocol::Outcome::kApplied;
  auto wait = std::chrono::milliseconds(50);
  for (int attempt = 1;; ++attempt) {
    try {
      return record(res);
    } catch (const std::exception& e) {
      if (attempt >= 8 || Clock::now() + wait >= lease_end) {
        common::Log("guard_answer_lost", {{"tenant", req.tenant_id},
                                          {"key", req.key},
                                          {"fencing_token", std::to_string(token)},
                                          {"http_status", std::to_string(res.status)},
                                          {"error", e.what()}});
        throw;
      }
      std::this_thread::sleep_for(wait);
      wait *= 2;
    }
  }
}

}  // namespace idemsaga::steps::guard::detail
