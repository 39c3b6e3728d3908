#include "orchestrator/store/span_store.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/json_text.hpp"
#include "common/pg/statement.hpp"
#include "common/trace/otlp.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;

using common::trace::SpanData;
using common::trace::SpanKind;
using common::trace::SpanStatus;

// The batch is one JSON object, {trace_id: [spans]}: one row per trace, parsed once.
const common::pg::Statement kInsert{R"sql(
  INSERT INTO trace_spans (trace_id, spans) SELECT key, value FROM json_each($1::json))sql"};

const common::pg::Statement kForTrace{
    "SELECT spans::text FROM trace_spans WHERE trace_id = $1 ORDER BY received_at"};

// Called after those traces' keys are deleted, so a key that still names a trace is another
// order's (a caller may send one trace id under keys of several tenants: hence across tenants,
// as the keys' deletion in parent_gc.cpp). Bounded by that deletion's batch: one trace per key,
// a few span rows each, so it is as short as the deletion that freed them. `= ANY` of an
// array goes through trace_spans_trace_id; `IN (SELECT json_array_elements_text(...))` could be
// planned as a scan of every span (and compiled with JIT) at every batch.
const common::pg::Statement kDeleteForTraces{R"sql(
  DELETE FROM trace_spans s
  WHERE s.trace_id = ANY (ARRAY(SELECT json_array_elements_text($1::json)))
    AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.trace_id = s.trace_id))sql"};

// Batched so that a large backlog never holds long locks or a long transaction.
const common::pg::Statement kDeleteUnowned{R"sql(
  DELETE FROM trace_spans WHERE ctid IN (
    SELECT s.ctid FROM trace_spans s
    WHERE s.received_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.trace_id = s.trace_id)
    LIMIT $2))sql"};

const char* StatusName(SpanStatus s) {
  return s == SpanStatus::kError ? "error" : s == SpanStatus::kOk ? "ok" : "unset";
}

}  // namespace

void SpanStore::Insert(const std::vector<SpanData>& spans) {
  if (spans.empty()) return;
  // Built as text, a span at a time: a document of the whole batch would hold every span of
  // it in memory several times over (the peak RSS of a busy orchestrator).
  std::map<std::string, std::string> by_trace;  // trace id -> its spans, comma-separated
  for (const auto& s : spans) {
    auto& list = by_trace[s.trace_id];
    if (!list.empty()) list.push_back(',');
    bool first = true;
    auto key = [&](const char* name) {
      list.append(first ? "{\"" : ",\"").append(name).append("\":");
      first = false;
    };
    auto text = [&](const char* name, std::string_view value) {
      key(name);
      common::json::AppendString(list, value);
    };
    auto number = [&](const char* name, long long value) {
      key(name);
      list.append(std::to_string(value));
    };
    text("span_id", s.span_id);
    text("parent_span_id", s.parent_span_id);
    text("service", s.service);
    text("name", s.name);
    number("kind", static_cast<int>(s.kind));
    number("start_unix_nano", s.start_unix_nano);
    number("end_unix_nano", s.end_unix_nano);
    text("status", StatusName(s.status));
    text("status_message", s.status_message);
    key("attributes");
    common::trace::AppendAttributesJson(list, s.attributes);
    list.push_back('}');
  }
  std::vector<std::string> members;  // "trace id":[spans], a row each
  members.reserve(by_trace.size());
  for (auto& [trace_id, list] : by_trace) {
    std::string member;
    member.reserve(trace_id.size() + list.size() + 6);
    common::json::AppendString(member, trace_id);
    member.append(":[").append(list).append("]");
    std::string().swap(list);
    members.push_back(std::move(member));
  }
  auto write = [&](const std::string& doc) {
    pool_.With([&](pqxx::connection& conn) {
      pqxx::nontransaction tx(conn);
      Exec(tx, kInsert, doc);
    });
  };
  if (rides_ != nullptr) return rides_->Carry(std::move(members), write);
  write(SpanRides::Doc(members));
}

std::vector<SpanData> SpanStore::ForTrace(const std::string& tenant_id,
                                          const std::string& trace_id) {
  auto rows = pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    return Exec(tx, kForTrace, trace_id);
  });
  std::vector<SpanData> out;
  std::set<std::string> seen;  // an exporter may deliver a batch twice
  for (const auto& r : rows) {
    for (const auto& j : nlohmann::json::parse(r[0].as<std::string>())) {
      // Every span our services make carries its tenant: a trace id learnt or reused by
      // another tenant shows nothing of this one's.
      const auto& attributes = j.at("attributes");
      auto tenant = attributes.find("tenant");
      if (tenant == attributes.end() || *tenant != tenant_id) continue;
      if (!seen.insert(j.at("span_id").get<std::string>()).second) continue;
      SpanData s;
      s.trace_id = trace_id;
      s.span_id = j.at("span_id").get<std::string>();
      s.parent_span_id = j.at("parent_span_id").get<std::string>();
      s.service = j.at("service").get<std::string>();
      s.name = j.at("name").get<std::string>();
      s.kind = static_cast<SpanKind>(j.at("kind").get<int>());
      s.start_unix_nano = j.at("start_unix_nano").get<long long>();
      s.end_unix_nano = j.at("end_unix_nano").get<long long>();
      auto status = j.at("status").get<std::string>();
      s.status = status == "error" ? SpanStatus::kError
                 : status == "ok"  ? SpanStatus::kOk
                                   : SpanStatus::kUnset;
      s.status_message = j.at("status_message").get<std::string>();
      for (const auto& [k, v] : attributes.items()) {
        if (v.is_string()) {
          s.attributes[k] = v.get<std::string>();
        } else if (v.is_boolean()) {
          s.attributes[k] = v.get<bool>();
        } else if (v.is_number_integer()) {
          s.attributes[k] = v.get<long long>();
        }
      }
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const SpanData& a, const SpanData& b) {
    return std::tie(a.start_unix_nano, a.span_id) < std::tie(b.start_unix_nano, b.span_id);
  });
  return out;
}

long long SpanStore::DeleteForTraces(const std::vector<std::string>& trace_ids) {
  if (trace_ids.empty()) return 0;
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    return static_cast<long long>(
        Exec(tx, kDeleteForTraces, nlohmann::json(trace_ids).dump()).affected_rows());
  });
}

long long SpanStore::DeleteUnowned(std::chrono::seconds older_than, int batch) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    return static_cast<long long>(
        Exec(tx, kDeleteUnowned, static_cast<double>(older_than.count()), batch).affected_rows());
  });
}

}  // namespace idemsaga::orchestrator::store
