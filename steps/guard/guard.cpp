// The guard's core: its answers (Problem, Refuse), the request's fingerprint, and the claim and
// replay of a key that every mode starts with. The modes: guard_local.cpp (Run),
// guard_planned.cpp (RunPlanned), guard_external.cpp (RunExternal, CompensateExternal),
// guard_compensation.cpp (Compensate); the statements: guard_sql.cpp; listing and GC:
// guard_keys.cpp.
#include "steps/guard/guard.hpp"

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/trace/span_status.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;

Response Problem(int status, const std::string& code, const std::string& detail) {
  common::http::Answer a = common::http::ProblemAnswer(status, code, detail);
  Response res{a.status, std::move(a.body), std::move(a.content_type)};
  res.headers = std::move(a.headers);
  return res;
}

Response Refuse(protocol::Refusal refusal) {
  const protocol::RefusalEntry& r = protocol::Describe(refusal);
  Response res = Problem(protocol::HttpStatus(r.code), protocol::ToString(r.code), r.detail);
  res.outcome = r.outcome;
  return res;
}

std::string Fingerprint(const Request& req) {
  return common::RequestFingerprint(req.method, req.path, req.body);
}

std::optional<Duplicates> ParseDuplicates(std::string_view name) {
  if (name == "wait") return Duplicates::kWait;
  if (name == "fail-fast") return Duplicates::kFailFast;
  return std::nullopt;
}

common::trace::Span Guard::StartSpan(const std::string& name, const Request& req) const {
  if (tracer_ == nullptr || !req.trace.valid()) return {};
  auto span = tracer_->Start(name, req.trace);
  span.Set("tenant", req.tenant_id).Set("idempotency_key", req.key);
  return span;
}

double Guard::RetentionSeconds() const { return static_cast<double>(options_.retention.count()); }

namespace detail {

std::optional<Response> Existing(pqxx::work& tx, const Request& req, const std::string& hash,
                                 double retention_s) {
  if (retention_s > 0) Exec(tx, kKeepAlive, req.tenant_id, req.key, retention_s);
  auto rows = Exec(tx, kLoad, req.tenant_id, req.key);
  if (rows.empty()) return std::nullopt;  // the claimant rolled back; claim again
  const auto& row = rows[0];
  auto status = protocol::ParseKeyStatus(row[0].as<std::string>());
  Response stored{row[2].as<int>(0), row[4].as<std::string>(""), row[3].as<std::string>(""), false,
                  protocol::Outcome::kCancelled};
  if (status == protocol::KeyStatus::kTombstone)
    return stored;  // compensated before it arrived: refuse
  const auto headers = nlohmann::json::parse(row[6].as<std::string>());  // outlives items()
  for (const auto& [name, value] : headers.items()) {
    if (value.is_string()) stored.headers[name] = value.get<std::string>();
  }
  if (row[1].as<std::string>() != hash) return Refuse(protocol::Refusal::kKeyReused);
  // An external call under a live lease.
  if (status == protocol::KeyStatus::kPending) return Refuse(protocol::Refusal::kKeyPending);
  // Replaying the success of an undone action would tell a late retry (say, of a parent
  // whose key expired) that the effect is in place.
  if (row[5].as<bool>()) return Refuse(protocol::Refusal::kCompensated);
  stored.replayed = true;
  stored.outcome = protocol::Outcome::kReplayed;
  return stored;
}

Claim ClaimOrReplay(pqxx::work& tx, const Request& req, const std::string& hash,
                    double retention_s) {
  if (!Exec(tx, kClaim, req.tenant_id, req.key, hash, retention_s).empty()) {
    return {Claim::Kind::kOwned, {}};
  }
  if (auto existing = Existing(tx, req, hash, retention_s)) {
    return {Claim::Kind::kAnswered, std::move(*existing)};
  }
  // Vanished between the two statements (its claimant rolled back): the next try claims it.
  return {Claim::Kind::kRaced, {}};
}

Response AnswerBusy(common::pg::Pool& pool, const Request& req) {
  // Whoever holds the lock may only be reading a finished key (a replay): what is stored
  // answers this request too. Only a key still being written is in progress. A read only (no
  // keep-alive, which would wait on the holder's row lock).
  std::optional<Response> stored;
  try {
    stored = pool.With([&](pqxx::connection& conn) {
      pqxx::work tx(conn);
      return Existing(tx, req, Fingerprint(req), 0);
    });
  } catch (const pqxx::sql_error&) {
    // Answered as busy below; a retry finds the key settled.
  }
  if (stored && stored->outcome != protocol::Outcome::kInProgress) return *stored;
  return Refuse(protocol::Refusal::kKeyBusy);
}

std::string HeadersJson(const Response& res) { return nlohmann::json(res.headers).dump(); }

void Store(pqxx::work& tx, const Request& req, const Response& res) {
  Exec(tx, kStore, req.tenant_id, req.key, res.status, res.content_type, res.body,
       HeadersJson(res));
}

bool IsLockTimeout(const pqxx::sql_error& e) { return e.sqlstate() == "55P03"; }

Response Applied(Response res, common::trace::Span& span) {
  res.replayed = false;
  res.outcome = protocol::Outcome::kApplied;
  common::trace::EndWorkSpan(span, res.status, "refused (stored and replayed)");
  return res;
}

}  // namespace detail
}  // namespace idemsaga::steps::guard
