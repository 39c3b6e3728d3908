// The trip's two participants, each an HTTP service of its own with its own database, its
// effects guarded by idemsaga: the hotel books rooms, the car desk rents cars (and has none in
// Atlantis, a business refusal that the guard stores and replays like a success).
#pragma once

#include <idemsaga/guard.hpp>
#include <memory>
#include <string>
#include <thread>

namespace trip {

class Service {
 public:
  // "hotel" or "car", on `database_url` (migrated here: the guard's key table and its own).
  Service(const std::string& kind, const std::string& database_url, const std::string& token);
  ~Service();
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  common::pg::Pool pool_;
  steps::guard::Guard guard_;
  steps::guard::HttpGuard http_;
  common::http::Server server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace trip
