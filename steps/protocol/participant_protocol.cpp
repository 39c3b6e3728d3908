#include "steps/protocol/participant_protocol.hpp"

#include <ostream>
#include <stdexcept>

namespace idemsaga::steps::protocol {

std::ostream& operator<<(std::ostream& out, Outcome outcome) {
  return out << '"' << ToString(outcome) << '"';
}

nlohmann::json KeyRecord::ToJson() const {
  return {{"key", key},
          {"status", ToString(status)},
          {"response_status", response_status},
          {"compensated", compensated},
          {"age_seconds", age_seconds}};
}

std::string CompensationBody(const std::string& action_key, Outcome outcome,
                             const nlohmann::json& detail) {
  nlohmann::json body = {{"action_key", action_key}, {"outcome", ToString(outcome)}};
  if (detail.is_object()) body.update(detail);
  return body.dump();
}

KeyRecord KeyRecord::FromJson(const nlohmann::json& json) {
  auto name = json.at("status").get<std::string>();
  auto status = ParseKeyStatus(name);
  if (!status) throw std::invalid_argument("a key record with an unknown status: " + name);
  return {json.at("key").get<std::string>(), *status, json.at("response_status").get<int>(),
          json.at("compensated").get<bool>(), json.at("age_seconds").get<double>()};
}

}  // namespace idemsaga::steps::protocol
