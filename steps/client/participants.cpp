#include "steps/client/participants.hpp"

#include <stdexcept>

namespace steps::client {

ParticipantClient& Participants::Add(const std::string& name, ParticipantClient::Options options) {
  auto& slot = clients_[name];
  slot = std::make_unique<ParticipantClient>(std::move(options));
  return *slot;
}

ParticipantClient& Participants::Get(const std::string& name) const {
  auto it = clients_.find(name);
  if (it == clients_.end()) {
    throw std::out_of_range("no participant named '" + name + "' is configured (--participant " +
                            name + "=http://HOST:PORT)");
  }
  return *it->second;
}

std::vector<std::pair<std::string, ParticipantClient*>> Participants::All() const {
  std::vector<std::pair<std::string, ParticipantClient*>> out;
  for (const auto& [name, client] : clients_) out.emplace_back(name, client.get());
  return out;
}

}  // namespace steps::client
