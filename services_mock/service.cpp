#include "services_mock/service.hpp"

#include <stdexcept>

#include "common/http/openapi.hpp"

namespace services_mock {

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
      pool_({.url = database_url, .size = options.pool_size}),
      faults_(faults),
      exporter_(
          options.otlp_endpoint.empty()
              ? nullptr
              : std::make_unique<common::trace::Exporter>(
                    common::trace::Exporter::OtlpHttp(options.otlp_endpoint, options.otlp_headers),
                    common::trace::Exporter::Options{})),
      tracer_(NameOf(kind), exporter_.get()),
      participant_(NameOf(kind), pool_, faults_, options, exporter_ ? &tracer_ : nullptr),
      server_(options.limits),
      gc_("participant_gc", std::chrono::minutes(1), [this] {
        while (participant_.guard().DeleteExpired(1000) == 1000) {
        }
      }) {
  participant_.AdminRoutes(server_);
  switch (kind_) {
    case ParticipantKind::kInventory:
      RegisterInventoryRoutes(server_, participant_);
      break;
    case ParticipantKind::kPayment:
      RegisterPaymentRoutes(server_, participant_);
      break;
    case ParticipantKind::kShipping:
      RegisterShippingRoutes(server_, participant_);
      break;
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
  server_.Serve();
}

void ParticipantService::Stop() {
  faults_.Release();
  server_.Stop();
  gc_.Stop();
}

}  // namespace services_mock
