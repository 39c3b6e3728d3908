#include "orchestrator/store/span_store.hpp"

#include <nlohmann/json.hpp>

#include "common/pg/statement.hpp"
#include "common/trace/otlp.hpp"

namespace orchestrator {
namespace {

using common::pg::Exec;

using common::trace::AttributeValue;
using common::trace::SpanData;
using common::trace::SpanKind;
using common::trace::SpanStatus;

// The whole batch is one JSON parameter, expanded by jsonb_to_recordset.
const common::pg::Statement kInsert{R"sql(
  INSERT INTO spans (trace_id, span_id, parent_span_id, service, name, kind, start_unix_nano,
                     end_unix_nano, status, status_message, attributes)
  SELECT trace_id, span_id, nullif(parent_span_id, ''), service, name, kind, start_unix_nano,
         end_unix_nano, status, status_message, attributes
  FROM jsonb_to_recordset($1::jsonb) AS s(trace_id text, span_id text, parent_span_id text,
       service text, name text, kind smallint, start_unix_nano bigint, end_unix_nano bigint,
       status text, status_message text, attributes jsonb)
  ON CONFLICT (trace_id, span_id) DO NOTHING)sql"};

const common::pg::Statement kForTrace{R"sql(
  SELECT trace_id, span_id, coalesce(parent_span_id, ''), service, name, kind, start_unix_nano,
         end_unix_nano, status, status_message, attributes::text
  FROM spans
  -- Every span our services make carries its tenant: a trace id learnt or reused by another
  -- tenant shows nothing of this one's.
  WHERE trace_id = $1 AND attributes->>'tenant' = $2
  ORDER BY start_unix_nano, span_id)sql"};

const char* StatusName(SpanStatus s) {
  return s == SpanStatus::kError ? "error" : s == SpanStatus::kOk ? "ok" : "unset";
}

}  // namespace

void SpanStore::Insert(const std::vector<SpanData>& spans) {
  if (spans.empty()) return;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& s : spans) {
    nlohmann::json attrs = common::trace::AttributesJson(s.attributes);
    rows.push_back({{"trace_id", s.trace_id},
                    {"span_id", s.span_id},
                    {"parent_span_id", s.parent_span_id},
                    {"service", s.service},
                    {"name", s.name},
                    {"kind", static_cast<int>(s.kind)},
                    {"start_unix_nano", s.start_unix_nano},
                    {"end_unix_nano", s.end_unix_nano},
                    {"status", StatusName(s.status)},
                    {"status_message", s.status_message},
                    {"attributes", attrs}});
  }
  pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    Exec(tx, kInsert, rows.dump());
  });
}

std::vector<SpanData> SpanStore::ForTrace(const std::string& tenant_id,
                                          const std::string& trace_id) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    std::vector<SpanData> out;
    for (const auto& r : Exec(tx, kForTrace, trace_id, tenant_id)) {
      SpanData s;
      s.trace_id = r[0].as<std::string>();
      s.span_id = r[1].as<std::string>();
      s.parent_span_id = r[2].as<std::string>();
      s.service = r[3].as<std::string>();
      s.name = r[4].as<std::string>();
      s.kind = static_cast<SpanKind>(r[5].as<int>());
      s.start_unix_nano = r[6].as<long long>();
      s.end_unix_nano = r[7].as<long long>();
      auto status = r[8].as<std::string>();
      s.status = status == "error" ? SpanStatus::kError
                 : status == "ok"  ? SpanStatus::kOk
                                   : SpanStatus::kUnset;
      s.status_message = r[9].as<std::string>();
      // Named: iterating items() of a temporary would outlive it.
      auto attributes = nlohmann::json::parse(r[10].as<std::string>());
      for (const auto& [k, v] : attributes.items()) {
        if (v.is_string())
          s.attributes[k] = v.get<std::string>();
        else if (v.is_boolean())
          s.attributes[k] = v.get<bool>();
        else if (v.is_number_integer())
          s.attributes[k] = v.get<long long>();
      }
      out.push_back(std::move(s));
    }
    return out;
  });
}

}  // namespace orchestrator
