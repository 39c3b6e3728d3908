#include "steps/client/participants.hpp"

#include <stdexcept>

namespace idemsaga::steps::client {

HttpParticipantClient& Participants::Add(const std::string& name,
                                         HttpParticipantClient::Options options) {
  auto& slot = clients_[name];
  slot = std::make_unique<HttpParticipantClient>(std::move(options));
  return *slot;
}

HttpParticipantClient& Participants::Get(const std::string& name) const {
  auto it = clients_.find(name);
  if (it == clients_.end()) {
    throw std::out_of_range("no participant named '" + name + "' is configured (--participant " +
                            name + "=http://HOST:PORT)");
  }
  return *it->second;
}

std::vector<std::pair<std::string, HttpParticipantClient*>> Participants::All() const {
  std::vector<std::pair<std::string, HttpParticipantClient*>> out;
  for (const auto& [name, client] : clients_) out.emplace_back(name, client.get());
  return out;
}

}  // namespace idemsaga::steps::client
