#include "app/client_commands.hpp"

#include <httplib.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "app/commands.hpp"
#include "common/percent_encode.hpp"
#include "common/trace/view.hpp"

namespace idemsaga::app {
namespace {

void AddConnectionFlags(CLI::App* cmd, ClientFlags& f) {
  cmd->add_option("--url", f.url, "orchestrator base URL")->capture_default_str();
  cmd->add_option("--api-key", f.api_key, "tenant API key")
      ->envname("IDEMSAGA_API_KEY")
      ->required();
}

std::unique_ptr<httplib::Client> Connect(const ClientFlags& f) {
  auto c = std::make_unique<httplib::Client>(f.url);
  c->set_connection_timeout(3);
  c->set_read_timeout(30);
  return c;
}

void PrintTrace(const ClientFlags& f) {
  auto r = Connect(f)->Get(("/v1/orders/" + common::PercentEncode(f.key) + "/trace").c_str(),
                           {{"Authorization", "Bearer " + f.api_key}});
  if (!r || r->status != 200) {
    std::cerr << "could not read the trace: " << (r ? r->body : httplib::to_string(r.error()))
              << std::endl;
    SetExitCode(1);
    return;
  }
  std::cout << common::trace::RenderWaterfall(nlohmann::json::parse(r->body));
}

void Print(const httplib::Result& r) {
  if (!r) {
    std::cerr << "request failed: " << httplib::to_string(r.error())
              << " (retrying with the same key is safe)" << std::endl;
    SetExitCode(1);
    return;
  }
  std::cout << "HTTP " << r->status << std::endl;
  for (const char* h : {"Idempotent-Replayed", "Retry-After", "Location"}) {
    if (r->has_header(h)) std::cout << h << ": " << r->get_header_value(h) << std::endl;
  }
  auto body = nlohmann::json::parse(r->body, nullptr, false);
  std::cout << (body.is_discarded() ? r->body : body.dump(2)) << std::endl;
  if (r->status >= 400) SetExitCode(1);
}

}  // namespace

void AddClientCommands(CLI::App& app, ClientFlags& f, std::function<void()>& run) {
  auto* order = app.add_subcommand("order", "Submit an order (POST /v1/orders)");
  AddConnectionFlags(order, f);
  order->add_option("--key", f.key, "Idempotency-Key (reuse it to retry safely)")->required();
  order->add_option("--customer-id", f.customer_id, "the order's customer_id")
      ->capture_default_str();
  order->add_option("--sku", f.sku, "the SKU of the order's one item (widget, gadget, ...)")
      ->capture_default_str();
  order->add_option("--quantity", f.quantity, "how many of that item")->capture_default_str();
  order
      ->add_option("--amount-cents", f.amount_cents,
                   "the amount to charge, in the currency's minor unit")
      ->capture_default_str();
  order->add_option("--currency", f.currency, "ISO 4217 code of the amount")->capture_default_str();
  order
      ->add_option("--payment-method", f.payment_method,
                   "pm_card_visa, or pm_card_declined to see a compensation")
      ->capture_default_str();
  order->add_flag("--trace", f.show_trace, "print the order's trace as a waterfall too");
  order->callback([&f, &run] {
    run = [&f] {
      nlohmann::json body = {{"customer_id", f.customer_id},
                             {"items", {{{"sku", f.sku}, {"quantity", f.quantity}}}},
                             {"amount_cents", f.amount_cents},
                             {"currency", f.currency},
                             {"payment_method", f.payment_method}};
      Print(Connect(f)->Post("/v1/orders",
                             {{"Authorization", "Bearer " + f.api_key}, {"Idempotency-Key", f.key}},
                             body.dump(), "application/json"));
      if (f.show_trace) {
        std::cout << std::endl;
        PrintTrace(f);
      }
    };
  });

  auto* event = app.add_subcommand(
      "event",
      "Deliver an external event to a waiting run (POST /v1/runs/{saga}/{key}/events/{name})");
  AddConnectionFlags(event, f);
  event->add_option("--saga", f.saga, "the run's saga")->capture_default_str();
  event->add_option("--run", f.run, "the run's Idempotency-Key")->required();
  event->add_option("--name", f.event_name, "the event, e.g. payment_confirmed")->required();
  event->add_option("--key", f.key, "the event's own Idempotency-Key (reuse it to retry safely)")
      ->required();
  event->add_option("--payload", f.payload, "the event's JSON payload")->capture_default_str();
  event->callback([&f, &run] {
    run = [&f] {
      // Both names go in as they are: the key may hold any printable character, `/` included.
      std::string path = "/v1/runs/" + common::PercentEncode(f.saga) + "/" +
                         common::PercentEncode(f.run) + "/events/" +
                         common::PercentEncode(f.event_name);
      Print(Connect(f)->Post(path,
                             {{"Authorization", "Bearer " + f.api_key}, {"Idempotency-Key", f.key}},
                             f.payload, "application/json"));
    };
  });

  auto* sagas = app.add_subcommand("sagas", "List sagas by state; retry, cancel or resolve one");
  sagas->require_subcommand(1);
  auto* list = sagas->add_subcommand("list", "A tenant's sagas, newest first");
  AddConnectionFlags(list, f);
  list->add_option("--status", f.status, "started, compensating, completed or failed");
  list->add_flag("--stuck", f.stuck_only, "only sagas whose compensation keeps failing");
  list->callback([&f, &run] {
    run = [&f] {
      std::string path = "/v1/sagas?limit=100";
      if (!f.status.empty()) path += "&status=" + common::PercentEncode(f.status);
      if (f.stuck_only) path += "&stuck=true";
      Print(Connect(f)->Get(path.c_str(), {{"Authorization", "Bearer " + f.api_key}}));
    };
  });
  auto* retry = sagas->add_subcommand("retry", "Retry a stuck compensation now");
  AddConnectionFlags(retry, f);
  retry->add_option("key", f.key, "the saga's Idempotency-Key")->required();
  retry->callback([&f, &run] {
    run = [&f] {
      Print(Connect(f)->Post(("/v1/sagas/" + common::PercentEncode(f.key) + "/retry").c_str(),
                             {{"Authorization", "Bearer " + f.api_key}}, "", "application/json"));
    };
  });

  // cancel and resolve: an operator's decision, with who and why (the orchestrator logs both).
  for (auto [name, help, why_flag, why_field] :
       {std::tuple{"cancel", "Stop a running saga at its next step and compensate what ran",
                   "--reason", "reason"},
        std::tuple{"resolve",
                   "Record that a stuck compensation was done by hand; the saga goes on and "
                   "ends failed",
                   "--note", "note"}}) {
    auto* cmd = sagas->add_subcommand(name, help);
    AddConnectionFlags(cmd, f);
    cmd->add_option("key", f.key, "the saga's Idempotency-Key")->required();
    cmd->add_option(why_flag, f.why, "why (kept with the saga and in the audit log)")->required();
    cmd->add_option("--operator", f.operator_name, "who decides (default: $USER)");
    cmd->callback([&f, &run, name = std::string(name), field = std::string(why_field)] {
      run = [&f, name, field] {
        std::string who = f.operator_name;
        if (who.empty() && std::getenv("USER") != nullptr) who = std::getenv("USER");
        nlohmann::json body = {{field, f.why}};
        if (!who.empty()) body["operator"] = who;
        Print(Connect(f)->Post(("/v1/sagas/" + common::PercentEncode(f.key) + "/" + name).c_str(),
                               {{"Authorization", "Bearer " + f.api_key}}, body.dump(),
                               "application/json"));
      };
    });
  }

  auto* trace = app.add_subcommand("trace", "Print an order's trace as a waterfall");
  AddConnectionFlags(trace, f);
  trace->add_option("key", f.key, "the order's Idempotency-Key")->required();
  trace->callback([&f, &run] { run = [&f] { PrintTrace(f); }; });

  auto* orders = app.add_subcommand("orders", "Inspect orders");
  orders->require_subcommand(1);
  auto* get = orders->add_subcommand("get", "Show a saga: status, steps, stored response");
  AddConnectionFlags(get, f);
  get->add_option("key", f.key, "the order's Idempotency-Key")->required();
  get->callback([&f, &run] {
    run = [&f] {
      Print(Connect(f)->Get(("/v1/orders/" + common::PercentEncode(f.key)).c_str(),
                            {{"Authorization", "Bearer " + f.api_key}}));
    };
  });
}

}  // namespace idemsaga::app
