#include "orchestrator/reconcile.hpp"

#include <set>
#include <sstream>

#include "common/percent_encode.hpp"
#include "steps/client/participant_client.hpp"
#include "steps/protocol/participant_protocol.hpp"
#include "steps/saga/definition.hpp"
#include "steps/saga/runner.hpp"

namespace idemsaga::orchestrator {
namespace {

using steps::protocol::KeyStatus;

constexpr int kPage = 500;

bool Stopping(const ReconcileOptions& o) { return o.stopping && o.stopping(); }

struct Found {
  std::string participant;
  steps::protocol::KeyRecord record;
};

// Reads every key `tenant` wrote in the window from one participant, page by page, with the
// step client (the service token, its timeouts) on the participant's key-listing route.
// Throws when the tenant's keys pass options.max_keys (or the run is stopped): a partial
// set would make every key beyond it look missing.
void ReadKeys(const std::string& name, const ReconcileParticipant& p, const std::string& tenant,
              const ReconcileOptions& options, std::map<std::string, Found>& keys) {
  steps::client::HttpParticipantClient client({.base_url = p.base_url,
                                               .service_token = p.service_token,
                                               .connect_timeout = options.timeout,
                                               .read_timeout = options.timeout});
  const auto since = options.since;
  std::string after;
  for (;;) {
    if (Stopping(options)) throw std::runtime_error(name + ": stopped");
    std::string path =
        std::string(steps::protocol::kKeysPath) + "?tenant=" + common::PercentEncode(tenant) +
        "&since_seconds=" + std::to_string(since.count()) + "&limit=" + std::to_string(kPage);
    if (!after.empty()) path += "&after=" + common::PercentEncode(after);
    std::string error;
    int status = 0;
    auto body = client.GetJson(path, error, status);
    if (!body) throw std::runtime_error(name + ": " + error);
    for (const auto& k : body->at("keys")) {
      auto rec = steps::protocol::KeyRecord::FromJson(k);
      keys[rec.key] = {name, rec};
    }
    // Checked after each page, the last one too: whether a tenant is judged must not depend
    // on where its pages end.
    if (static_cast<long long>(keys.size()) > options.max_keys) {
      throw std::runtime_error(name + ": more than " + std::to_string(options.max_keys) +
                               " keys in the window; reconcile a shorter one");
    }
    if (body->at("next").is_null()) return;
    after = (*body)["next"].get<std::string>();
  }
}

// Every call `steps` (the records of a saga run under `key`, or of a child run under its
// derived key) made, judged against what the participants hold; a child's records are judged
// as its parent's, since the child ends as its parent does.
void JudgeSteps(const std::string& tenant, const store::SagaRow& row, const std::string& key,
                const store::ReadRecords& records, const std::map<std::string, Found>& keys,
                std::set<std::string>& derived, ReconcileReport& report) {
  bool finished =
      row.status == store::SagaStatus::kCompleted || row.status == store::SagaStatus::kFailed;
  for (size_t i = 0; i < records.steps.size(); ++i) {
    if (records.unreadable.count(i) != 0) {
      report.errors.push_back("tenant " + tenant + ": saga " + row.key +
                              " has a step record this build cannot read");
      continue;
    }
    const steps::saga::StepRecord& s = records.steps[i];
    const auto& step = s.name;
    if (s.output.is_object() && s.output.contains("saga") &&
        s.output.contains("steps")) {  // a child saga: its own calls are what was sent
      JudgeSteps(tenant, row, steps::saga::ActionKey(key, step),
                 store::ReadSteps(s.output["steps"]), keys, derived, report);
      continue;
    }
    // A wait (no participant, no key) or a step its condition skipped: nothing was sent.
    if (s.action_key.empty() || s.status == steps::saga::StepStatus::kSkipped) continue;
    auto action = steps::saga::ActionKey(key, step);
    derived.insert(action);
    derived.insert(steps::saga::CompensationKey(key, step));
    if (!finished) continue;  // in flight: nothing to judge yet
    Discrepancy d{tenant, row.key, row.saga_name, std::string(ToString(row.status)), step, action};
    auto it = keys.find(action);
    if (it != keys.end()) d.participant = it->second.participant;
    const auto* k = it == keys.end() ? nullptr : &it->second.record;
    if (row.status == store::SagaStatus::kCompleted) {
      if (k == nullptr) {
        d.problem = "action_missing";
        d.detail = "no participant has this action's key";
      } else if (k->status == KeyStatus::kPending) {
        d.problem = "action_pending";
        d.detail = "the participant still holds the call open";
      } else if (!k->Applied()) {
        d.problem = "action_refused";
        d.detail = k->status == KeyStatus::kTombstone
                       ? "the participant refused it (a compensation came first)"
                       : "the participant stored HTTP " + std::to_string(k->response_status);
      } else if (k->compensated) {
        d.problem = "action_compensated";
        d.detail = "the participant undid it";
      }
    } else if (k != nullptr && k->status == KeyStatus::kPending) {
      d.problem = "action_pending";
      d.detail = "the participant still holds the call open";
    } else if (k != nullptr && k->Applied() && !k->compensated) {
      d.problem = "action_still_applied";
      d.detail = "the saga failed, yet the participant's action stands (never undone)";
    }
    if (!d.problem.empty()) report.Add(std::move(d));
  }
}

}  // namespace

nlohmann::json Discrepancy::ToJson() const {
  return {{"tenant", tenant_id},
          {"idempotency_key", parent_key},
          {"saga", saga},
          {"saga_status", saga_status},
          {"step", step},
          {"key", key},
          {"participant", participant},
          {"problem", problem},
          {"detail", detail}};
}

void ReconcileReport::Add(Discrepancy d) {
  ++discrepancies_found;
  if (discrepancies.size() < max_listed) discrepancies.push_back(std::move(d));
}

nlohmann::json ReconcileReport::ToJson() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& d : discrepancies) list.push_back(d.ToJson());
  return {{"since_seconds", since.count()},
          {"sagas_checked", sagas_checked},
          {"keys_read", keys_read},
          {"discrepancies_found", discrepancies_found},
          {"discrepancies", list},
          {"errors", errors},
          {"clean", clean()}};
}

std::string ReconcileReport::ToText() const {
  std::ostringstream out;
  out << "reconcile: the last " << since.count() << " s, " << sagas_checked << " sagas, "
      << keys_read << " participant keys: " << discrepancies_found << " discrepanc"
      << (discrepancies_found == 1 ? "y" : "ies") << ", " << errors.size() << " error"
      << (errors.size() == 1 ? "" : "s");
  if (static_cast<long long>(discrepancies.size()) < discrepancies_found) {
    out << " (the first " << discrepancies.size() << " listed)";
  }
  out << "\n";
  for (const auto& d : discrepancies) {
    out << "  " << d.problem << "  tenant=" << d.tenant_id << " key=" << d.key;
    if (!d.parent_key.empty()) {
      out << " saga=" << d.saga << "/" << d.parent_key << " (" << d.saga_status
          << ") step=" << d.step;
    }
    out << " participant=" << (d.participant.empty() ? "-" : d.participant) << ": " << d.detail
        << "\n";
  }
  for (const auto& e : errors) out << "  error: " << e << "\n";
  return out.str();
}

Reconciler::Reconciler(store::ParentStore& store,
                       std::map<std::string, ReconcileParticipant> participants,
                       ReconcileOptions options)
    : store_(store), participants_(std::move(participants)), options_(std::move(options)) {
  options_.since = std::min(options_.since, store_.options().retention);
}

ReconcileReport Reconciler::Run() {
  ReconcileReport report;
  report.since = options_.since;
  report.max_listed = options_.max_listed;
  for (const auto& tenant : store_.TenantIds()) {
    if (Stopping(options_)) {
      report.errors.emplace_back("stopped before tenant " + tenant);
      break;
    }
    Tenant(tenant, report);
  }
  return report;
}

void Reconciler::Tenant(const std::string& tenant, ReconcileReport& report) {
  std::map<std::string, Found> keys;
  for (const auto& [name, p] : participants_) {
    try {
      ReadKeys(name, p, tenant, options_, keys);
    } catch (const std::exception& e) {
      report.errors.push_back("tenant " + tenant + ": participant " + e.what());
      if (static_cast<long long>(keys.size()) > options_.max_keys || Stopping(options_)) {
        report.keys_read += static_cast<long long>(keys.size());
        return;  // judged against part of its keys, every saga past them would look wrong
      }
    }
  }
  report.keys_read += static_cast<long long>(keys.size());

  std::set<std::string> derived;  // every key a saga in the window derived
  std::string after;
  for (;;) {
    if (Stopping(options_)) {
      report.errors.push_back("tenant " + tenant + ": stopped");
      return;
    }
    if (static_cast<long long>(derived.size()) > 4 * options_.max_keys) {
      report.errors.push_back("tenant " + tenant + ": its sagas derive more than " +
                              std::to_string(4 * options_.max_keys) +
                              " keys in the window; reconcile a shorter one");
      return;
    }
    auto rows = store_.CreatedSince(tenant, options_.since, after, kPage);
    for (const auto& row : rows) {
      bool finished =
          row.status == store::SagaStatus::kCompleted || row.status == store::SagaStatus::kFailed;
      if (finished) ++report.sagas_checked;
      JudgeSteps(tenant, row, row.key, {row.steps, row.unreadable_steps}, keys, derived, report);
    }
    if (static_cast<int>(rows.size()) < kPage) break;
    after = rows.back().key;
  }

  // A key no saga in the window derived: its saga may be older (a long run), so look for a
  // parent under each prefix it could have been derived from ("<parent>-<step>[-compensate]").
  std::map<std::string, bool> parent_exists;
  for (const auto& [key, found] : keys) {
    if (Stopping(options_)) {
      report.errors.push_back("tenant " + tenant + ": stopped");
      return;
    }
    if (derived.count(key) ||
        found.record.age_seconds < static_cast<double>(options_.settle.count()))
      continue;
    // The parent it was derived from, or that parent's parent when the key is a child saga's
    // (whose run key is itself an action key): the exact inverse of the derivation.
    bool has_parent = false;
    for (auto from = steps::saga::ParseDerivedKey(key); from && !has_parent;
         from = steps::saga::ParseDerivedKey(from->parent)) {
      auto [it, fresh] = parent_exists.try_emplace(from->parent, false);
      if (fresh) it->second = store_.Get(tenant, from->parent).has_value();
      has_parent = it->second;
    }
    if (has_parent) continue;
    report.Add({tenant, "", "", "", "", key, found.participant, "key_without_parent",
                "no saga derived this key (answered HTTP " +
                    std::to_string(found.record.response_status) + ")"});
  }
}

std::optional<std::chrono::seconds> ParseDuration(const std::string& text) {
  if (text.empty() || text.size() > 12) return std::nullopt;
  size_t digits = text.find_first_not_of("0123456789");
  if (digits == 0) return std::nullopt;
  long long n = std::stoll(text.substr(0, digits));
  std::string unit = digits == std::string::npos ? "s" : text.substr(digits);
  long long scale = unit == "s"   ? 1
                    : unit == "m" ? 60
                    : unit == "h" ? 3600
                    : unit == "d" ? 86400
                                  : 0;
  if (scale == 0 || n <= 0) return std::nullopt;
  return std::chrono::seconds(n * scale);
}

}  // namespace idemsaga::orchestrator
