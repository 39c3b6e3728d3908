// idemsaga: the stock binary, an idemsaga::App with the product's sagas and participants, and
// the demo's own commands. Nothing in it is special: a team's binary is the same App with its
// own sagas.
//   idemsaga dev                      the whole stack on a private PostgreSQL (.idemsaga/)
//   idemsaga orchestrator ...         the coordinator service
//   idemsaga inventory|payment|shipping ...  one demo participant
//   idemsaga migrate ...              apply the embedded SQL migrations
//   idemsaga tenant create NAME       a tenant and its API key (printed once)
//   idemsaga order ... / orders get K submit an order, read a saga
#include <chrono>
#include <string>

#include "app/app.hpp"
#include "cmd/idemsaga/crash_points.hpp"
#include "cmd/idemsaga/stock.hpp"
#include "common/defaults.hpp"
#include "demo/stack.hpp"
#include "steps/sagas.hpp"

int main(int argc, char** argv) {
  namespace defaults = idemsaga::common::defaults;
  namespace demo = idemsaga::demo;
  idemsaga::App app;
  for (const auto& p : demo::kStackParticipants) {  // the demo's, passed as a team passes its own
    app.Participant(p.name, {.url = p.called_by_default ? defaults::LocalUrl(p.port) : "",
                             .business_errors = p.business_errors});
  }
  // The shipping participant reached through its command queue (--participant-queue
  // shipping_queue=QUEUE), which ship_order version 2 calls: the same business refusals.
  app.Participant("shipping_queue",
                  {.business_errors = demo::StackParticipantNamed("shipping").business_errors});
  // The sagas are built once the flags are read: this option reaches them.
  auto place_order = std::make_shared<idemsaga::steps::PlaceOrderOptions>();
  app.Option("--payment-confirmation-timeout-ms",
             "how long an order paid by a card that needs 3-D Secure waits for "
             "payment_confirmed before it releases the stock and voids the charge (default "
             "900000)",
             [place_order](const std::string& value) {
               place_order->confirmation_timeout = std::chrono::milliseconds(std::stoll(value));
             });
  for (size_t i = 0; i < idemsaga::steps::ShippedSagas().size(); ++i) {
    app.Saga([place_order, i](idemsaga::Participants& p) {
      return idemsaga::steps::ShippedSagas(*place_order)[i](p);
    });
  }
  auto& stock = idemsaga::AppImpl(app);
  stock.default_service_token = demo::kServiceToken;
  stock.default_listen = defaults::LocalListen(defaults::kOrchestratorPort);
  stock.at_boundary = idemsaga::cmd::CrashPointsFromEnvironment();  // the fault suite's kills
  stock.commands = {idemsaga::cmd::AddDevCommand, idemsaga::cmd::AddParticipantCommands};
  return app.Run(argc, argv);
}
