// The demo stack in one table: its participants (the name sagas call each by, the port
// `idemsaga dev` and `idemsaga <participant>` serve it on, the business refusals it declares:
// the only 4xx answers a saga takes as final) and the service token every demo service takes
// and sends. The stock binary, `idemsaga dev`, the benchmark and the tests read them here; no
// library default does (a team's orchestrator and participants name their own, and a missing
// one fails at start-up). The token is public, for a local stack only: a deployment sets its
// own (--service-token, IDEMSAGA_SERVICE_TOKEN).
//
// Constants only: thread-safe.
//   for (const auto& p : demo::kStackParticipants) app.Participant(p.name, ...);
#pragma once

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace idemsaga::demo {

inline constexpr const char* kServiceToken = "dev-service-token";

// The refusals the demo participants answer with (and declare to the orchestrator).
inline constexpr const char* kInsufficientStock = "insufficient_stock";
inline constexpr const char* kCardDeclined = "card_declined";
inline constexpr const char* kAuthenticationRequired = "authentication_required";
inline constexpr const char* kChargeNotCapturable = "charge_not_capturable";
inline constexpr const char* kAddressUnserviceable = "address_unserviceable";

struct StackParticipant {
  std::string name;
  int port = 0;  // on 127.0.0.1
  std::set<std::string> business_errors;
  // Whether the stock orchestrator calls it unless told where it is: shipping is opt-in
  // (--participant shipping=URL), so ship_order is served only where one is named.
  bool called_by_default = true;
};

inline const std::vector<StackParticipant> kStackParticipants = {
    {.name = "inventory", .port = 8081, .business_errors = {kInsufficientStock}},
    {.name = "payment",
     .port = 8082,
     .business_errors = {kCardDeclined, kAuthenticationRequired, kChargeNotCapturable}},
    {.name = "shipping",
     .port = 8083,
     .business_errors = {kAddressUnserviceable},
     .called_by_default = false},
};

// The row named `name`; throws std::out_of_range for a participant the demo does not have.
inline const StackParticipant& StackParticipantNamed(const std::string& name) {
  for (const auto& p : kStackParticipants) {
    if (p.name == name) return p;
  }
  throw std::out_of_range("the demo has no participant named " + name);
}

}  // namespace idemsaga::demo
