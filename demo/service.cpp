#include "demo/service.hpp"

#include <stdexcept>

#include "common/http/openapi.hpp"
#include "common/pg/errors.hpp"

namespace idemsaga::demo {

const char* NameOf(ParticipantKind kind) {
  switch (kind) {
    case ParticipantKind::kInventory:
      return "inventory";
    case ParticipantKind::kPayment:
      return "payment";
    case ParticipantKind::kShipping:
      return "shipping";
  }
  throw std::invalid_argument("unknown participant kind");
}

ParticipantService::ParticipantService(ParticipantKind kind, const std::string& database_url,
                                       ParticipantOptions options, FaultSettings faults)
    : kind_(kind),
      faults_(faults),
      exporter_(
          options.otlp_endpoint.empty()
              ? nullptr
              : std::make_unique<common::trace::Exporter>(
                    common::trace::Exporter::OtlpHttp(options.otlp_endpoint, options.otlp_headers),
                    common::trace::Exporter::Options{})),
      tracer_(NameOf(kind), exporter_.get()),
      server_(options.limits, common::pg::Classify),
      gc_("participant_gc", std::chrono::minutes(1), [this] {
        // Redis expires its keys itself (and its scripts trim the key index).
        if (!pool_) return;
        gc_.Drain([this] { return routes_->guard().DeleteExpired(1000); }, 1000);
      }) {
  const common::trace::Tracer* tracer = exporter_ ? &tracer_ : nullptr;
  if (!options.redis_url.empty()) {
    if (kind_ != ParticipantKind::kInventory) {
      throw std::invalid_argument(std::string(NameOf(kind_)) +
                                  ": only the inventory can keep its store in Redis");
    }
    auto fsync = steps::guard::ParseRedisFsync(options.redis_fsync);
    if (!fsync) throw std::invalid_argument("unknown Redis fsync '" + options.redis_fsync + "'");
    redis_ = std::make_unique<common::redis::Pool>(
        common::redis::Pool::Options{.url = options.redis_url, .size = options.pool_size});
    redis_inventory_ = std::make_unique<RedisInventory>(
        *redis_, std::chrono::duration_cast<std::chrono::seconds>(options.guard.retention));
    redis_inventory_->guard().CheckServer(*fsync);
    redis_inventory_->Seed();
    auto* inventory = redis_inventory_.get();
    routes_ = std::make_unique<GuardedRoutes>(
        NameOf(kind), faults_, options,
        StoreHooks{.ready = [inventory] { return inventory->guard().Ready(); },
                   .list_keys =
                       [inventory](const std::string& tenant, std::chrono::seconds since,
                                   const std::string& after, int limit) {
                         return inventory->guard().ListKeys(tenant, since, after, limit);
                       }},
        tracer);
    routes_->AdminRoutes(server_);
    RegisterRedisInventoryRoutes(server_, *routes_, *redis_inventory_);
  } else {
    pool_ = std::make_unique<common::pg::Pool>(
        common::pg::Pool::Options{.url = database_url, .size = options.pool_size});
    routes_ = std::make_unique<GuardedRoutes>(NameOf(kind), *pool_, faults_, options, tracer);
    routes_->AdminRoutes(server_);
    switch (kind_) {
      case ParticipantKind::kInventory:
        RegisterInventoryRoutes(server_, *routes_);
        break;
      case ParticipantKind::kPayment:
        RegisterPaymentRoutes(server_, *routes_);
        break;
      case ParticipantKind::kShipping:
        RegisterShippingRoutes(server_, *routes_);
        break;
    }
  }
  if (!options.amqp.urls.empty()) {
    auto amqp = options.amqp;
    if (amqp.queue.empty()) amqp.queue = NameOf(kind);
    amqp.classify = common::pg::Classify;
    commands_ = std::make_unique<steps::guard::QueueCommands>(std::move(amqp), routes_->commands(),
                                                              &routes_->metrics());
  }
  const auto& texts = OpenApiTexts();
  common::http::AddOpenApiRoute(
      server_, common::http::MergeOpenApi(nlohmann::json::parse(texts.at("participant")),
                                          nlohmann::json::parse(texts.at(NameOf(kind_)))));
}

ParticipantService::~ParticipantService() { Stop(); }

int ParticipantService::Bind(const std::string& host, int port) {
  int bound = server_.Bind(host, port);
  if (bound < 0) {
    throw std::runtime_error(std::string(NameOf(kind_)) + ": cannot listen on " + host + ":" +
                             std::to_string(port));
  }
  return bound;
}

void ParticipantService::Serve() {
  gc_.Start();
  if (commands_) commands_->Start();
  server_.Serve();
}

void ParticipantService::Stop() {
  faults_.Release();
  if (commands_) commands_->Stop();
  server_.Stop();
  gc_.Stop();
}

}  // namespace idemsaga::demo
