#include "tests/chaos/history.hpp"

#include <nlohmann/json.hpp>
#include <set>

#include "common/crypto.hpp"

namespace chaos {

std::string Counts(std::initializer_list<std::pair<const char*, long long>> counts) {
  std::string out;
  for (const auto& [name, n] : counts) out += " " + std::string(name) + "=" + std::to_string(n);
  return out;
}

std::string SagaOutcome(const std::string& body) {
  auto json = nlohmann::json::parse(body, nullptr, false);
  if (!json.is_object()) return "";
  // A completed saga's answer says "status": "completed"; a failed one is a problem (RFC 9457)
  // whose "status" is the HTTP status and whose "saga_status" says "failed".
  for (const char* field : {"saga_status", "status"}) {
    auto it = json.find(field);
    if (it != json.end() && it->is_string() && !it->get<std::string>().empty()) {
      std::string s = it->get<std::string>();
      return s == "completed" || s == "failed" ? s : "";
    }
  }
  return "";
}

long long History::Now() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start_)
      .count();
}

int History::Client() {
  auto [it, added] = clients_.emplace(std::this_thread::get_id(), 0);
  if (added) it->second = static_cast<int>(clients_.size());
  return it->second;
}

Event History::Append(Event e) {
  e.client = Client();
  e.at_us = Now();
  events_.push_back(e);
  return e;
}

long long History::Invoke(const std::string& tenant, const std::string& key,
                          const std::string& body) {
  std::lock_guard lock(mutex_);
  Event e{.type = Event::Type::kInvoke, .op = next_op_++, .tenant = tenant, .key = key};
  e.body_hash = idemsaga::common::Sha256Hex(body).substr(0, 16);
  invoked_[e.op] = events_.size();
  return Append(std::move(e)).op;
}

void History::Complete(long long op, int status, std::string body) {
  Answer({.type = Event::Type::kComplete, .op = op, .status = status, .body = std::move(body)});
}

void History::Info(long long op, std::string why) {
  Answer({.type = Event::Type::kInfo, .op = op, .body = std::move(why)});
}

void History::Answer(Event e) {
  std::lock_guard lock(mutex_);
  auto invoke = invoked_.find(e.op);
  if (invoke != invoked_.end()) {
    e.tenant = events_[invoke->second].tenant;
    e.key = events_[invoke->second].key;
  }
  Append(std::move(e));
}

std::vector<Event> History::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

long long Violations::Total() const {
  return created_without_one_effect + failed_with_net_effect + replay_mismatch + divergent_keys +
         lost_acks + undecided_keys + phantom_effects + unmatched_events;
}

std::string Violations::Line() const {
  return "violations=" + std::to_string(Total()) +
         Counts({{"created_without_one_effect", created_without_one_effect},
                 {"failed_with_net_effect", failed_with_net_effect},
                 {"replay_mismatch", replay_mismatch},
                 {"divergent_keys", divergent_keys},
                 {"lost_acks", lost_acks},
                 {"undecided_keys", undecided_keys},
                 {"phantom_effects", phantom_effects},
                 {"unmatched_events", unmatched_events}});
}

Violations CheckHistory(const std::vector<Event>& events, const std::map<KeyId, KeyState>& states) {
  Violations v;
  auto note = [&v](const char* rule, const KeyId& id, const std::string& what) {
    if (v.examples.size() < 10) {
      v.examples.push_back(std::string(rule) + " " + id.first + "/" + id.second + ": " + what);
    }
  };
  struct KeyHistory {
    const Event* first_final = nullptr;
    std::set<std::pair<int, std::string>> finals;  // every distinct final answer
    bool completed = false, failed = false;
  };
  std::map<KeyId, KeyHistory> keys;
  std::map<long long, const Event*> invokes;
  std::set<long long> answered;
  static const KeyState kNoRow;
  auto state_of = [&](const KeyId& id) -> const KeyState& {
    auto it = states.find(id);
    return it == states.end() ? kNoRow : it->second;
  };
  for (const Event& e : events) {
    if (e.type == Event::Type::kInvoke) {
      if (!invokes.emplace(e.op, &e).second) {
        ++v.unmatched_events;
        note("unmatched_events", {e.tenant, e.key},
             "op " + std::to_string(e.op) + " invoked twice");
      }
      keys[{e.tenant, e.key}];
      continue;
    }
    auto invoke = invokes.find(e.op);
    if (invoke == invokes.end() || !answered.insert(e.op).second) {
      ++v.unmatched_events;
      note("unmatched_events", {e.tenant, e.key},
           "op " + std::to_string(e.op) + " answered without an open invoke");
      continue;
    }
    if (e.type == Event::Type::kInfo) continue;
    std::string outcome = SagaOutcome(e.body);
    if (outcome.empty()) continue;  // 202, 409, 503...: the key stays open
    KeyId id{invoke->second->tenant, invoke->second->key};
    KeyHistory& k = keys[id];
    if (k.first_final == nullptr) {
      k.first_final = &e;
    } else if (e.status != k.first_final->status || e.body != k.first_final->body) {
      ++v.replay_mismatch;
      note("replay_mismatch", id,
           std::to_string(e.status) + " " + e.body + " after " +
               std::to_string(k.first_final->status) + " " + k.first_final->body);
    }
    k.finals.insert({e.status, e.body});
    (outcome == "completed" ? k.completed : k.failed) = true;
    const KeyState& s = state_of(id);
    if (s.status != outcome || s.stored_status != e.status || s.stored_body != e.body) {
      ++v.lost_acks;
      note("lost_acks", id,
           "answered " + std::to_string(e.status) + " " + outcome + ", stored '" + s.status + "' " +
               std::to_string(s.stored_status));
    }
  }
  for (const auto& [op, invoke] : invokes) {
    if (answered.count(op) == 0) {
      ++v.unmatched_events;
      note("unmatched_events", {invoke->tenant, invoke->key},
           "op " + std::to_string(op) + " has no complete or info");
    }
  }
  for (const auto& [id, k] : keys) {
    const KeyState& s = state_of(id);
    if (k.finals.size() > 1) {
      ++v.divergent_keys;
      note("divergent_keys", id, std::to_string(k.finals.size()) + " different final answers");
    }
    if (k.first_final == nullptr) {
      ++v.undecided_keys;
      note("undecided_keys", id, "no final answer");
    }
    if (k.completed && (s.reservation_rows != 1 || s.reservations_held != 1 || s.charge_rows != 1 ||
                        s.charges_in_force != 1)) {
      ++v.created_without_one_effect;
      note("created_without_one_effect", id,
           "reservations " + std::to_string(s.reservations_held) + "/" +
               std::to_string(s.reservation_rows) + " charges " +
               std::to_string(s.charges_in_force) + "/" + std::to_string(s.charge_rows));
    }
    if (k.failed && (s.reservations_held != 0 || s.charges_in_force != 0)) {
      ++v.failed_with_net_effect;
      note("failed_with_net_effect", id,
           "held " + std::to_string(s.reservations_held) + " captured " +
               std::to_string(s.charges_in_force));
    }
  }
  for (const auto& [id, s] : states) {
    if ((s.reservation_rows > 0 || s.charge_rows > 0) && keys.count(id) == 0) {
      ++v.phantom_effects;
      note("phantom_effects", id, "effects of a key no client sent");
    }
  }
  return v;
}

}  // namespace chaos
