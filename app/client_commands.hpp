// The client side of the CLI: `idemsaga order`, `event`, `sagas ...`, `trace` and `orders get`.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "common/defaults.hpp"

namespace idemsaga::app {

struct ClientFlags {
  std::string url = common::defaults::LocalUrl(common::defaults::kOrchestratorPort);
  std::string api_key;
  std::string key;
  // The order defaults are the body of the README's curl example, so that `idemsaga order`
  // with the same key replays that order instead of answering 422.
  std::string customer_id = "cust_1";
  std::string sku = "widget";
  long long quantity = 2;
  long long amount_cents = 2500;
  std::string currency = "USD";
  std::string payment_method = "pm_card_visa";
  // An external event (event): the run it is for, its name and payload.
  std::string saga = "place_order";
  std::string run;
  std::string event_name;
  std::string payload = "{}";
  std::string status;
  bool stuck_only = false;
  bool show_trace = false;
  // An operator's decision (sagas cancel|resolve): why, and who (default: $USER).
  std::string why;
  std::string operator_name;
};

void AddClientCommands(CLI::App& app, ClientFlags& flags, std::function<void()>& run);

}  // namespace idemsaga::app
