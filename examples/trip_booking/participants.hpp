// The trip's two participants, each an HTTP service of its own with a database of its own and
// its effects guarded by idemsaga. The hotel books rooms in its own PostgreSQL (one
// transaction with the key); the car desk rents through a third party's API, an effect outside
// the database (a lease and a fencing token on the key, no transaction open during the call).
#pragma once

#include <idemsaga/guard.hpp>
#include <string>
#include <thread>

namespace trip {

class Service {
 public:
  enum class Kind { kHotel, kCar };
  // Migrates `database_url` (the guard's key table, and the hotel's bookings); the car desk
  // rents through `rental_company_url`.
  Service(Kind kind, const std::string& database_url, const std::string& token,
          const std::string& rental_company_url = "");
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
