// A runnable demo participant (inventory, payment or shipping): its pool, faults, guard and
// server.
//
// Used by `idemsaga inventory|payment|shipping|dev` and by tests, which bind port 0 and serve on a
// thread. Bind() and Serve() from one thread; Stop() from any.
//   ParticipantService svc(ParticipantKind::kInventory, url, {});
//   int port = svc.Bind("127.0.0.1", 0); std::thread t([&] { svc.Serve(); }); ... svc.Stop();
#pragma once

#include <memory>
#include <string>

#include "common/periodic.hpp"
#include "common/trace/exporter.hpp"
#include "demo/faults.hpp"
#include "demo/guarded_routes.hpp"
#include "demo/redis_inventory.hpp"

namespace idemsaga::demo {

enum class ParticipantKind { kInventory, kPayment, kShipping };

// "inventory", "payment" or "shipping": the service name and the database kind it migrates.
const char* NameOf(ParticipantKind kind);

// Routes of each demo participant (see docs/participants.md).
void RegisterInventoryRoutes(common::http::Server& server, GuardedRoutes& routes);
void RegisterPaymentRoutes(common::http::Server& server, GuardedRoutes& routes);
void RegisterShippingRoutes(common::http::Server& server, GuardedRoutes& routes);

// docs/openapi/participant.json (what every participant serves) and each participant's own
// routes (inventory.json, ...) by name, embedded at build time; served merged at /openapi.json.
const std::map<std::string, std::string>& OpenApiTexts();

class ParticipantService {
 public:
  // With options.redis_url (inventory only) `database_url` is unused: the store is Redis, whose
  // server is checked (RedisGuard::CheckServer) and seeded here; throws when it is not
  // fit, or unreachable.
  ParticipantService(ParticipantKind kind, const std::string& database_url,
                     ParticipantOptions options, FaultSettings faults = {});
  ~ParticipantService();

  // Returns the bound port; throws std::runtime_error when the address is taken.
  int Bind(const std::string& host, int port);
  void Serve();
  void Stop();
  Faults& faults() { return faults_; }
  common::trace::Exporter* exporter() { return exporter_.get(); }
  const common::http::Server& server() const { return server_; }

 private:
  ParticipantKind kind_;
  std::unique_ptr<common::pg::Pool> pool_;           // null on Redis
  std::unique_ptr<common::redis::Pool> redis_;       // null on PostgreSQL
  std::unique_ptr<RedisInventory> redis_inventory_;  // null on PostgreSQL
  Faults faults_;
  std::unique_ptr<common::trace::Exporter> exporter_;  // null when spans go nowhere
  common::trace::Tracer tracer_;
  std::unique_ptr<GuardedRoutes> routes_;
  common::http::Server server_;
  common::Periodic gc_;
  std::unique_ptr<steps::guard::QueueCommands> commands_;  // null without amqp urls
};

}  // namespace idemsaga::demo
