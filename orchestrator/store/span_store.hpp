// Stored spans: written in batches (one statement per batch, off the request path; with
// SpanRides, inside the statements of sagas' finishes while there are any, at most 32 KiB a
// finish), read by trace, and deleted with the keys that own their traces (garbage
// collection, run by orchestrator/recovery.cpp). Thread-safe.
//   store.Insert(batch); auto spans = store.ForTrace(tenant_id, trace_id);
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/pg/pool.hpp"
#include "common/trace/span.hpp"
#include "orchestrator/store/span_rides.hpp"

namespace idemsaga::orchestrator::store {

class SpanStore {
 public:
  // With `rides`, Insert hands its rows to the finishes that take them (span_rides.hpp).
  explicit SpanStore(common::pg::Pool& pool, SpanRides* rides = nullptr)
      : pool_(pool), rides_(rides) {}

  // Returns once the spans are durable.
  void Insert(const std::vector<common::trace::SpanData>& spans);
  // The tenant's spans of a trace, by start time.
  std::vector<common::trace::SpanData> ForTrace(const std::string& tenant_id,
                                                const std::string& trace_id);
  // Garbage collection, after the keys that owned `trace_ids` were deleted: their spans, unless
  // a key still names the trace (a caller may send one traceparent for several orders).
  // Returns the rows deleted.
  long long DeleteForTraces(const std::vector<std::string>& trace_ids);
  // Deletes up to `batch` rows of spans that no key accounts for (a refused request's, a
  // caller's trace whose orders are gone, or a key's whose DeleteForTraces never ran) once
  // they were received more than `older_than` ago.
  long long DeleteUnowned(std::chrono::seconds older_than, int batch);

 private:
  common::pg::Pool& pool_;
  SpanRides* rides_;
};

}  // namespace idemsaga::orchestrator::store
