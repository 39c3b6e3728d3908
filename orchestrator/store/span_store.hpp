// Stored spans: written in batches (one statement, one commit per batch, never on an order's
// request path) and read by trace. Thread-safe.
//   store.Insert(batch); auto spans = store.ForTrace(trace_id);
#pragma once

#include <string>
#include <vector>

#include "common/pg/pool.hpp"
#include "common/trace/span.hpp"

namespace idemsaga::orchestrator::store {

class SpanStore {
 public:
  explicit SpanStore(common::pg::Pool& pool) : pool_(pool) {}

  void Insert(const std::vector<common::trace::SpanData>& spans);
  // The tenant's spans of a trace, by start time.
  std::vector<common::trace::SpanData> ForTrace(const std::string& tenant_id,
                                                const std::string& trace_id);

 private:
  common::pg::Pool& pool_;
};

}  // namespace idemsaga::orchestrator::store
