// The participants sagas call, by name ("inventory", "shipping"): one HttpParticipantClient each,
// with its own kept-alive connections and its declared business refusals.
//
// Fill it before the sagas are built; then thread-safe (the clients are, and the set is fixed).
//   steps::client::Participants p;
//   p.Add("shipping", {.base_url = "http://127.0.0.1:8083", .business_errors = {"..."}});
//   saga::StepResult r = p.Get("shipping").Post("/v1/shipments", ctx, body);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "steps/client/participant_client.hpp"

namespace idemsaga::steps::client {

class Participants final : public idemsaga::Participants {
 public:
  // Replaces a client of the same name.
  HttpParticipantClient& Add(const std::string& name, HttpParticipantClient::Options options);
  // Throws std::out_of_range naming the participant when none has that name: a saga that
  // calls an unconfigured participant fails at start-up, not at its first order.
  HttpParticipantClient& Get(const std::string& name) const override;
  bool Has(const std::string& name) const override { return clients_.count(name) != 0; }
  // Every client, by name.
  std::vector<std::pair<std::string, HttpParticipantClient*>> All() const;

 private:
  std::map<std::string, std::unique_ptr<HttpParticipantClient>> clients_;
};

}  // namespace idemsaga::steps::client
