#include "services_mock/service.hpp"

#include <stdexcept>

namespace services_mock {

const char* NameOf(ParticipantKind kind) {
  return kind == ParticipantKind::kInventory ? "inventory" : "payment";
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
  if (kind_ == ParticipantKind::kInventory) {
    RegisterInventoryRoutes(server_, participant_);
  } else {
    RegisterPaymentRoutes(server_, participant_);
  }
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
