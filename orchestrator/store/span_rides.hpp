// Stored spans riding on sagas' finishes: ParentStore::Finish's statement inserts the span rows
// waiting here in its own transaction, so under load spans cost no commit of their own (each
// exported batch used to commit alone: about 0.025 commits per order over its four).
//
// The span store's side (Carry) blocks until every part it brought is durable. A part is
// written by its owner alone instead when it is larger than one finish carries, when no finish
// has run lately (an idle orchestrator, a trace read flushing its spans: at once), when none
// takes it within `wait`, or when the finish that took it failed (its statement was not
// committed, or may not have been: a part written twice is read once, by span id). The
// finish's side (Take, then Done) never waits.
//
// Thread-safe.
//   SpanRides rides({});
//   rides.Carry(parts, [&](const std::string& doc) { /* INSERT ... json_each(doc) */ });
//   auto load = rides.Take();  /* the finish, with load.doc */  rides.Done(load, committed);
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace idemsaga::orchestrator::store {

class SpanRides {
 public:
  struct Options {
    // How long a part waits for a finish before its owner writes it alone.
    std::chrono::milliseconds wait{100};
    // No finish for this long: no load to ride on, parts are written alone at once.
    std::chrono::milliseconds idle{50};
    // Bytes of span rows one finish carries at most; a larger row is written alone.
    size_t max_bytes = 32 * 1024;
  };

  struct Part;
  // A finish's passengers: `doc` is a JSON object {trace_id: [spans], ...} (keys may repeat:
  // it is read as json, with json_each), "{}" for none.
  struct Load {
    std::string doc = "{}";
    std::vector<std::shared_ptr<Part>> parts;
  };

  explicit SpanRides(Options options) : options_(options) {}

  // `members` are the rows to store, each a JSON object member `"trace_id":[spans]`. Returns
  // when all are durable; throws what `write_alone` (given the rows not carried, as one doc)
  // threw.
  void Carry(std::vector<std::string> members,
             const std::function<void(const std::string& doc)>& write_alone);

  // `members` as one JSON object.
  static std::string Doc(const std::vector<std::string>& members);

  // For a finish about to run: what waits, up to max_bytes.
  Load Take();
  // The finish's statement committed (true), or failed (false: the owners write their parts).
  void Done(Load& load, bool committed);

  long long carried() const;  // parts stored by a finish
  long long alone() const;    // parts their owners wrote

 private:
  const Options options_;
  mutable std::mutex mutex_;
  std::condition_variable landed_;
  std::deque<std::shared_ptr<Part>> waiting_;
  std::chrono::steady_clock::time_point last_finish_{};
  long long carried_ = 0, alone_ = 0;
};

}  // namespace idemsaga::orchestrator::store
