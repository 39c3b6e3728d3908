// Reconciliation: what the orchestrator says each saga did, checked against what every
// participant's guard stored under the saga's derived keys. For every tenant it reads the
// sagas created in the window and the keys each participant wrote in it (GET
// /v1/idempotency/keys, with the service token), and reports:
//   - a `completed` saga whose step action is missing, refused, or compensated;
//   - a `failed` saga whose step action is still applied (answered 2xx, never undone);
//   - a participant key that no saga derived (no parent under that key and step).
// Running sagas are skipped (their keys are in flight), and so are keys younger than
// `settle`. Read-only: it writes nothing anywhere.
// Bounded whatever the window holds: the report lists the first `max_listed` discrepancies
// and counts the rest, and a tenant with more than `max_keys` participant keys in the window
// is reported as an error (reconcile a shorter window) rather than read into memory.
//
// Not thread-safe; run one at a time (the CLI, or the orchestrator's periodic job).
//   orchestrator::Reconciler r(store, {{"inventory", {url, token}}}, {.since = 1h});
//   auto report = r.Run();  // report.discrepancies.empty() when all agree
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator {

struct Discrepancy {
  std::string tenant_id;
  std::string parent_key;  // "" for a participant key with no parent
  std::string saga;        // its name, and its status when it has a parent
  std::string saga_status;
  std::string step;
  std::string key;          // the derived key in question
  std::string participant;  // where it is (or should be)
  std::string problem;      // action_missing | action_refused | action_compensated |
                            // action_still_applied | action_pending | key_without_parent
  std::string detail;
  nlohmann::json ToJson() const;
};

struct ReconcileReport {
  std::chrono::seconds since{0};
  long long sagas_checked = 0;
  long long keys_read = 0;
  long long discrepancies_found = 0;  // all of them; `discrepancies` lists the first ones
  std::vector<Discrepancy> discrepancies;
  std::vector<std::string> errors;  // participants or tenants that could not be read
  size_t max_listed = 1000;
  bool clean() const { return discrepancies_found == 0 && errors.empty(); }
  void Add(Discrepancy d);
  nlohmann::json ToJson() const;
  std::string ToText() const;
};

struct ReconcileParticipant {
  std::string base_url;
  std::string service_token;
};

struct ReconcileOptions {
  // Sagas created, and keys written, this long ago at most (clamped to the parents'
  // retention: a parent collected by GC would make its keys look orphaned).
  std::chrono::seconds since{3600};
  // A participant key this young may belong to a saga still being written: not judged.
  std::chrono::seconds settle{60};
  std::chrono::milliseconds timeout{10000};  // per participant request
  size_t max_listed = 1000;                  // discrepancies listed; the rest are counted
  long long max_keys = 500000;     // participant keys (and sagas' derived keys) per tenant held
  std::function<bool()> stopping;  // checked between pages: true ends the run
};

class Reconciler {
 public:
  Reconciler(store::ParentStore& store, std::map<std::string, ReconcileParticipant> participants,
             ReconcileOptions options);
  ReconcileReport Run();

 private:
  void Tenant(const std::string& tenant, ReconcileReport& report);

  store::ParentStore& store_;
  std::map<std::string, ReconcileParticipant> participants_;
  ReconcileOptions options_;
};

// "1h", "30m", "90s", "2d" or plain seconds; nullopt otherwise.
std::optional<std::chrono::seconds> ParseDuration(const std::string& text);

}  // namespace idemsaga::orchestrator
