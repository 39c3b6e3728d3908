#include "rental_company.hpp"

#include <nlohmann/json.hpp>

namespace trip {

RentalCompany::RentalCompany() {
  // POST /rentals {"ref", "city"}: rents a car (none in Atlantis: 422).
  server_.Post("/rentals", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = nlohmann::json::parse(req.body);
    if (body.at("city") == "Atlantis") {
      res.status = 422;
      res.set_content(R"({"error":"no cars in Atlantis"})", "application/json");
      return;
    }
    std::lock_guard lock(mutex_);
    std::string id = "rental_" + std::to_string(++rentals_);
    by_ref_[body.at("ref").get<std::string>()] = id;
    res.status = 201;
    res.set_content(nlohmann::json{{"rental_id", id}}.dump(), "application/json");
  });
  // GET /rentals?ref=...: the rental made under a reference, if any.
  server_.Get("/rentals", [this](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard lock(mutex_);
    auto it = by_ref_.find(req.get_param_value("ref"));
    if (it == by_ref_.end()) {
      res.status = 404;
      return;
    }
    res.set_content(nlohmann::json{{"rental_id", it->second}}.dump(), "application/json");
  });
  server_.Post(R"(/rentals/([^/]+)/cancel)",
               [this](const httplib::Request&, httplib::Response& res) {
                 std::lock_guard lock(mutex_);
                 ++cancellations_;
                 res.set_content(R"({"cancelled":true})", "application/json");
               });
  port_ = server_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { server_.listen_after_bind(); });
}

RentalCompany::~RentalCompany() {
  // stop() before the loop runs would be lost, and the loop would never end.
  for (int i = 0; i < 5000 && !server_.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_.stop();
  thread_.join();
}

int RentalCompany::rentals() {
  std::lock_guard lock(mutex_);
  return rentals_;
}

int RentalCompany::cancellations() {
  std::lock_guard lock(mutex_);
  return cancellations_;
}

}  // namespace trip
