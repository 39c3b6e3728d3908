#include "orchestrator/recovery.hpp"

#include <algorithm>
#include <thread>

#include "common/log.hpp"

namespace idemsaga::orchestrator {

Recovery::Recovery(store::ParentStore& store, store::SpanStore& spans, SagaService& sagas,
                   RecoveryOptions options)
    : store_(store),
      spans_(spans),
      sagas_(sagas),
      options_(options),
      sweeper_("recovery_sweep", options.sweep_interval, [this] { Drain(); }),
      collector_("gc", options.gc_interval, [this] { CollectGarbage(); }) {}

void Recovery::Start() {
  if (!options_.enabled) return;
  sweeper_.Start();
  collector_.Start();
}

void Recovery::Stop() {
  stopping_ = true;  // a draining sweep ends at its next pass, not an interval later
  sweeper_.Stop();
  collector_.Stop();
}

int Recovery::SweepOnce() { return Sweep(std::min(options_.sweep_batch, sagas_.FreeCapacity())); }

int Recovery::Sweep(int capacity) {
  if (capacity <= 0) return 0;
  auto claims = store_.TakeOverExpiredBatch(sagas_.owner(), capacity);
  int resumed = 0;
  for (const auto& claim : claims) {
    // Refused only when shutting down: the lease then expires again for another replica.
    resumed += sagas_.ResumeAsync(claim) ? 1 : 0;
  }
  return resumed;
}

void Recovery::Drain() {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + options_.sweep_interval;
  bool more = true;  // the last sweep took all it asked for: others may be due
  while (more && !stopping_ && Clock::now() < until) {
    int ask = std::min(options_.sweep_batch, sagas_.FreeCapacity());
    if (ask <= 0) {
      // Every thread is busy with sagas this sweep resumed; they take milliseconds each.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    more = Sweep(ask) == ask;
  }
}

void Recovery::CollectGarbage() {
  long long spans = 0;
  long long total = collector_.Drain(
      [&] {
        auto gone = store_.DeleteExpired(options_.gc_batch);
        spans += spans_.DeleteForTraces(gone.trace_ids);
        return gone.keys;
      },
      options_.gc_batch);
  const auto retention =
      std::chrono::duration_cast<std::chrono::seconds>(store_.options().retention);
  long long unowned = collector_.Drain(
      [&] { return spans_.DeleteUnowned(retention, options_.gc_batch); }, options_.gc_batch);
  if (total > 0 || spans > 0 || unowned > 0) {
    common::Log("gc", {{"deleted_keys", std::to_string(total)},
                       {"deleted_key_spans", std::to_string(spans)},
                       {"deleted_unowned_spans", std::to_string(unowned)}});
  }
}

}  // namespace idemsaga::orchestrator
