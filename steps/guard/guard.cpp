#include "steps/guard/guard.hpp"

#include <optional>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/pg/statement.hpp"

namespace steps::guard {
namespace {

using common::pg::Exec;

// Blocks on the unique index while a concurrent duplicate is uncommitted (bounded by the
// session's lock_timeout); returns a row only to the request that now owns the key.
const common::pg::Statement kClaim{R"sql(
  INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, status, expires_at)
  VALUES ($1, $2, $3, 'started', now() + make_interval(secs => $4))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

// Stores the key and its answer in one row, after the effect: the first writer of the key.
const common::pg::Statement kInsertAnswered{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, response_status, response_content_type,
     response_body, expires_at)
  VALUES ($1, $2, $3, 'completed', $4, $5, $6, now() + make_interval(secs => $7))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

const common::pg::Statement kLoad{R"sql(
  SELECT status, request_hash, response_status, response_content_type, response_body,
         compensated_at IS NOT NULL
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kStore{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = $3, response_content_type = $4, response_body = $5
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kTombstone{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, response_status, response_content_type,
     response_body, expires_at)
  VALUES ($1, $2, NULL, 'tombstone', 409, 'application/json', $3,
          now() + make_interval(secs => $4))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

// A key still in use (a stuck saga re-drives its steps, or retries a compensation, for as long
// as it takes) is kept a full retention from now. Only keys past half their retention are
// written, so ordinary replays stay read-only. It runs before the key is read: its row lock
// makes a concurrent garbage collection skip the key, where a read first could answer from a
// row that GC deletes a moment later.
const common::pg::Statement kKeepAlive{R"sql(
  UPDATE idempotency_keys SET expires_at = now() + make_interval(secs => $3)
  WHERE tenant_id = $1 AND idempotency_key = $2
    AND expires_at < now() + make_interval(secs => $3 / 2))sql"};

const common::pg::Statement kLockAction{R"sql(
  SELECT status, response_status, response_body, compensated_at IS NOT NULL
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2
  FOR UPDATE)sql"};

// The undone action is kept a full retention from now: a late retry of its key must keep
// hearing "compensated", never find the key free again.
const common::pg::Statement kMarkCompensated{R"sql(
  UPDATE idempotency_keys
  SET compensated_at = now(), expires_at = now() + make_interval(secs => $3)
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kDeleteExpired{R"sql(
  DELETE FROM idempotency_keys
  WHERE ctid IN (SELECT ctid FROM idempotency_keys WHERE expires_at < now() LIMIT $1))sql"};

// Thrown inside a compensation's transaction to roll it back and answer `action_unknown`.
struct ActionUnknown {};

// A transaction that lost a serialization or deadlock race is retried at once; it stored
// nothing. Anything else (including an in-doubt commit) goes to the caller.
constexpr int kRaceAttempts = 3;

Response Json(int status, const std::string& code, const std::string& message,
              const char* outcome) {
  return Response{status, common::http::ErrorBody(code, message), "application/json", false,
                  outcome};
}

// What an earlier request left under the key: a replay, a refusal, or nothing (not claimed).
std::optional<Response> Existing(pqxx::work& tx, const Request& req, const std::string& hash,
                                 double retention_s) {
  Exec(tx, kKeepAlive, req.tenant_id, req.key, retention_s);
  auto rows = Exec(tx, kLoad, req.tenant_id, req.key);
  if (rows.empty()) return std::nullopt;  // the claimant rolled back; claim again
  const auto& row = rows[0];
  auto status = row[0].as<std::string>();
  Response stored{row[2].as<int>(0), row[4].as<std::string>(""), row[3].as<std::string>(""), false,
                  "cancelled"};
  if (status == "tombstone") return stored;  // compensated before it arrived: refuse
  if (row[1].as<std::string>() != hash) {
    return Json(kKeyReusedStatus, "idempotency_key_reused",
                "this Idempotency-Key was used with a different request", "mismatch");
  }
  // Replaying the success of an undone action would tell a late retry (say, of a parent
  // whose key expired) that the effect is in place.
  if (row[5].as<bool>()) {
    return Json(kCompensatedStatus, "compensated",
                "this action was compensated (undone); it is no longer in effect", "compensated");
  }
  stored.replayed = true;
  stored.outcome = "replayed";
  return stored;
}

// Claims the key or answers from what is stored; nullopt means the caller owns the key now.
std::optional<Response> ClaimOrReplay(pqxx::work& tx, const Request& req, const std::string& hash,
                                      double retention_s) {
  if (!Exec(tx, kClaim, req.tenant_id, req.key, hash, retention_s).empty()) {
    return std::nullopt;
  }
  if (auto existing = Existing(tx, req, hash, retention_s)) return existing;
  // Vanished between the two statements (its claimant rolled back): the next try claims it.
  throw pqxx::serialization_failure("idempotency key claim raced with a rollback");
}

void Store(pqxx::work& tx, const Request& req, const Response& res) {
  Exec(tx, kStore, req.tenant_id, req.key, res.status, res.content_type, res.body);
}

bool IsLockTimeout(const pqxx::sql_error& e) { return e.sqlstate() == "55P03"; }

// The business effect, on the transaction that stores its answer; `span` is left open.
Response ApplyEffect(pqxx::work& tx, const Guard::Effect& effect, common::trace::Span& span) {
  Response res = effect(tx);
  res.replayed = false;
  res.outcome = "applied";
  span.Set("http.status_code", static_cast<long long>(res.status));
  if (res.status >= 400) {
    span.Error("refused (stored and replayed)");
  } else {
    span.Ok();
  }
  return res;
}

}  // namespace

std::string Fingerprint(const Request& req) {
  return common::RequestFingerprint(req.method, req.path, req.body);
}

common::trace::Span Guard::StartSpan(const std::string& name, const Request& req) const {
  if (tracer_ == nullptr || !req.trace.valid()) return {};
  auto span = tracer_->Start(name, req.trace);
  span.Set("tenant", req.tenant_id).Set("idempotency_key", req.key);
  return span;
}

template <typename Body>
Response Guard::InTransaction(const Request& req, const Body& body) {
  for (int attempt = 1;; ++attempt) {
    try {
      return pool_.With([&](pqxx::connection& conn) {
        pqxx::work tx(conn);
        Response res = body(tx);
        auto commit = StartSpan("guard commit", req);
        tx.commit();  // a read-only commit when `body` answered from what was stored
        commit.Set("outcome", res.outcome).Ok();
        return res;
      });
    } catch (const pqxx::transaction_rollback&) {
      if (attempt >= kRaceAttempts) throw;
    } catch (const ActionUnknown&) {
      return Json(kActionUnknownStatus, "action_unknown",
                  "the action this compensation undoes succeeded, but there is no record of it "
                  "here; nothing was undone or stored",
                  "action_unknown");
    } catch (const pqxx::sql_error& e) {
      if (!IsLockTimeout(e)) throw;
      return Json(kInProgressStatus, "idempotency_key_in_progress",
                  "a request with this Idempotency-Key is still being processed; retry later",
                  "in_progress");
    }
  }
}

Response Guard::Run(const Request& req, const Effect& effect, EffectScope scope) {
  const std::string hash = Fingerprint(req);
  struct KeyTaken {};
  if (scope == EffectScope::kTransactionOnly) {
    try {
      return InTransaction(req, [&](pqxx::work& tx) {
        auto span = StartSpan("business effect", req);
        Response res = ApplyEffect(tx, effect, span);
        if (Exec(tx, kInsertAnswered, req.tenant_id, req.key, hash, res.status, res.content_type,
                 res.body, RetentionSeconds())
                .empty()) {
          span.Set("outcome", std::string("rolled back: the key was taken"));
          throw KeyTaken{};
        }
        return res;
      });
    } catch (const KeyTaken&) {
      // Answered below, from the key.
    } catch (const pqxx::unique_violation&) {
      // The effect's own unique index (a charge per key) names a key that is probably taken:
      // below, the claim finds out, and an effect that trips again throws from there.
    }
  }
  return InTransaction(req, [&](pqxx::work& tx) {
    auto claim = StartSpan("guard claim", req);
    if (auto answered = ClaimOrReplay(tx, req, hash, RetentionSeconds())) {
      claim.Set("outcome", answered->outcome);
      if (answered->outcome == "mismatch") claim.Error("key reused with another request");
      return *answered;
    }
    claim.Set("outcome", std::string("claimed")).Ok();
    claim.End();
    auto span = StartSpan("business effect", req);
    Response res = ApplyEffect(tx, effect, span);
    span.End();
    Store(tx, req, res);
    return res;
  });
}

Response Guard::Compensate(const Request& req, const std::string& action_key, const Undo& undo,
                           bool action_applied) {
  const std::string hash = Fingerprint(req);
  return InTransaction(req, [&](pqxx::work& tx) {
    auto claim = StartSpan("guard claim", req);
    if (auto answered = ClaimOrReplay(tx, req, hash, RetentionSeconds())) {
      claim.Set("outcome", answered->outcome);
      return *answered;
    }
    claim.Set("outcome", std::string("claimed")).Ok();
    claim.End();
    auto undo_span = StartSpan("compensation effect", req);
    undo_span.Set("action_key", action_key).Set("compensation", true);
    nlohmann::json body = {{"action_key", action_key}};
    std::string refusal = common::http::ErrorBody(
        "cancelled", "this step was compensated before it arrived; it will not be applied");
    Exec(tx, kKeepAlive, req.tenant_id, action_key, RetentionSeconds());
    if (action_applied && Exec(tx, kLoad, req.tenant_id, action_key).empty()) {
      // The caller saw this action succeed, yet it has no record here (expired, restored from
      // an old backup): nothing can be undone, and a tombstone would make that final. Answer
      // without storing anything, so a retry after the record is restored undoes it.
      throw ActionUnknown();
    }
    if (!Exec(tx, kTombstone, req.tenant_id, action_key, refusal, RetentionSeconds()).empty()) {
      body["outcome"] = "cancelled";
    } else {
      // The action committed (the tombstone insert waited for it if it was in flight).
      auto row = Exec(tx, kLockAction, req.tenant_id, action_key)[0];
      auto status = row[0].as<std::string>();
      int action_status = row[1].as<int>(0);
      if (status == "tombstone") {
        body["outcome"] = "cancelled";
      } else if (row[3].as<bool>()) {
        body["outcome"] = "already_undone";
      } else if (action_status < 200 || action_status > 299) {
        body["outcome"] = "nothing_to_undo";
      } else {
        ActionRecord action{action_key, action_status,
                            nlohmann::json::parse(row[2].as<std::string>(), nullptr, false)};
        nlohmann::json detail = undo(tx, action);
        Exec(tx, kMarkCompensated, req.tenant_id, action_key, RetentionSeconds());
        body["outcome"] = "undone";
        if (detail.is_object()) body.update(detail);
      }
    }
    undo_span.Set("undo.outcome", body["outcome"].get<std::string>()).Ok();
    undo_span.End();
    Response res{200, body.dump(), "application/json", false, "applied"};
    Store(tx, req, res);
    return res;
  });
}

double Guard::RetentionSeconds() const { return static_cast<double>(options_.retention.count()); }

long long Guard::DeleteExpired(int batch) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::work tx(conn);
    auto r = Exec(tx, kDeleteExpired, batch);
    tx.commit();
    return static_cast<long long>(r.affected_rows());
  });
}

}  // namespace steps::guard
