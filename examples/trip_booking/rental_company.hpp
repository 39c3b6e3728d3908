// A stand-in for a third party the car desk rents through (a real one would be a partner's
// HTTP API): it is not idempotent, so each POST rents one more car. It counts what it did so
// that the example can show each rental happened once.
#pragma once

#include <httplib.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace trip {

class RentalCompany {
 public:
  RentalCompany();
  ~RentalCompany();
  std::string Url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int rentals();        // cars rented, ever
  int cancellations();  // rentals cancelled

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::map<std::string, std::string> by_ref_;  // the renter's reference -> rental id
  int rentals_ = 0, cancellations_ = 0;
};

}  // namespace trip
