#include "steps/guard/guard.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/http/server.hpp"
#include "common/idempotency_key.hpp"
#include "common/log.hpp"
#include "common/pg/statement.hpp"

namespace steps::guard {

Response Problem(int status, const std::string& code, const std::string& detail) {
  return Response{status, common::http::ProblemBody(status, code, detail),
                  common::http::kProblemContentType};
}

Response Refuse(Refusal refusal) {
  const RefusalEntry& r = Describe(refusal);
  Response res = Problem(HttpStatus(r.code), ToString(r.code), r.detail);
  res.outcome = r.outcome;
  if (RetriesLater(r.code)) res.headers["Retry-After"] = kRetryAfterSeconds;
  return res;
}

namespace {

using common::pg::Exec;

// Blocks on the unique index while a concurrent duplicate is uncommitted (bounded by the
// session's lock_timeout); returns a row only to the request that now owns the key.
const common::pg::Statement kClaim{R"sql(
  INSERT INTO idempotency_keys (tenant_id, idempotency_key, request_hash, status, expires_at)
  VALUES ($1, $2, $3, 'started', now() + make_interval(secs => $4))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING 1)sql"};

// Duplicates::kFailFast: one lock per (tenant, key) for this transaction, or false at once.
// A 64-bit hash: two keys that collide only make one of them wait for a retry.
const common::pg::Statement kTryKeyLock{R"sql(
  SELECT pg_try_advisory_xact_lock(hashtextextended($1 || E'\n' || $2, 0)))sql"};

// Stores the key and its answer in one row, after the effect: the first writer of the key.
// Its 8 parameters are numbered from $(after + 1): RunPlanned puts it after a plan's own.
// With `when`, the row is written only if that condition holds, and a key written meanwhile
// is a unique violation rather than a row skipped: what the statement did with it rolls back.
std::string InsertAnsweredSql(size_t after, const char* when = nullptr) {
  auto p = [after](size_t i) { return "$" + std::to_string(after + i); };
  std::string values = p(1) + ", " + p(2) + ", " + p(3) + ", 'completed', " + p(4) + ", " + p(5) +
                       ", " + p(6) + ", now() + make_interval(secs => " + p(7) + "), " + p(8) +
                       "::jsonb";
  return "INSERT INTO idempotency_keys\n"
         "    (tenant_id, idempotency_key, request_hash, status, response_status,\n"
         "     response_content_type, response_body, expires_at, response_headers)\n" +
         (when == nullptr
              ? "  VALUES (" + values + ")\n  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING"
              : "  SELECT " + values + " WHERE " + when) +
         "\n  RETURNING 1";
}
const common::pg::Statement kInsertAnswered{InsertAnsweredSql(0)};

const common::pg::Statement kLoad{R"sql(
  SELECT status, request_hash, response_status, response_content_type, response_body,
         compensated_at IS NOT NULL, response_headers::text
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

// RunExternal's claim: pending, under a lease and the first fencing token.
const common::pg::Statement kClaimPending{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, lease_expires_at, fencing_token,
     expires_at)
  VALUES ($1, $2, $3, 'pending', now() + make_interval(secs => $4), 1,
          now() + make_interval(secs => $5))
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING fencing_token)sql"};

// A pending claim whose holder's lease ran out, taken over under the next token.
const common::pg::Statement kTakeOverPending{R"sql(
  UPDATE idempotency_keys
  SET lease_expires_at = now() + make_interval(secs => $4), fencing_token = fencing_token + 1
  WHERE tenant_id = $1 AND idempotency_key = $2 AND request_hash = $3 AND status = 'pending'
    AND lease_expires_at <= now()
  RETURNING fencing_token)sql"};

// The external call's answer, stored only by the holder of the current token.
const common::pg::Statement kRecordExternal{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = $4, response_content_type = $5, response_body = $6,
      response_headers = $7::jsonb, lease_expires_at = NULL
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending' AND fencing_token = $3)sql"};

// Ends the lease now: the next request takes the claim over at once.
const common::pg::Statement kReleaseLease{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending' AND fencing_token = $3)sql"};

const common::pg::Statement kStore{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = $3, response_content_type = $4, response_body = $5,
      response_headers = $6::jsonb
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kTombstone{R"sql(
  INSERT INTO idempotency_keys
    (tenant_id, idempotency_key, request_hash, status, response_status, response_content_type,
     response_body, expires_at)
  VALUES ($1, $2, NULL, 'tombstone', 409, 'application/problem+json', $3,
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
  SELECT status, response_status, response_body, compensated_at IS NOT NULL,
         coalesce(lease_expires_at <= now(), false)
  FROM idempotency_keys WHERE tenant_id = $1 AND idempotency_key = $2
  FOR UPDATE)sql"};

// An external action whose holder's lease ran out, ended by its compensation: from now on it
// is refused (the holder's late answer too: the token moves on) and counts as undone; the undo
// then cancels whatever the cut-off call did at the third party.
const common::pg::Statement kCutOffPending{R"sql(
  UPDATE idempotency_keys
  SET status = 'completed', response_status = 409,
      response_content_type = 'application/problem+json', response_body = $3, response_headers = '{}', lease_expires_at = NULL,
      fencing_token = fencing_token + 1, compensated_at = now(),
      expires_at = now() + make_interval(secs => $4)
  WHERE tenant_id = $1 AND idempotency_key = $2 AND status = 'pending'
    AND lease_expires_at <= now())sql"};

// The undone action is kept a full retention from now: a late retry of its key must keep
// hearing "compensated", never find the key free again.
const common::pg::Statement kMarkCompensated{R"sql(
  UPDATE idempotency_keys
  SET compensated_at = now(), expires_at = now() + make_interval(secs => $3)
  WHERE tenant_id = $1 AND idempotency_key = $2)sql"};

const common::pg::Statement kDeleteExpired{R"sql(
  DELETE FROM idempotency_keys
  WHERE ctid IN (SELECT ctid FROM idempotency_keys
                 -- a pending key is an effect in doubt: kept until a retry or a compensation
                 -- settles it, or a later claim would not be told of the earlier attempt
                 WHERE expires_at < now() AND status <> 'pending' LIMIT $1))sql"};

// Thrown inside a compensation's transaction to roll it back and answer `action_unknown`.
struct ActionUnknown {};
// Thrown inside a compensation's transaction to roll it back and answer 409: the action it
// undoes is an external call still in flight.
struct ActionPending {};

// A transaction that lost a serialization or deadlock race is retried at once; it stored
// nothing. Anything else (including an in-doubt commit) goes to the caller.
constexpr int kRaceAttempts = 3;

// What an earlier request left under the key: a replay, a refusal, or nothing (not claimed).
// `retention_s` <= 0: read only (the key's expiry is not moved).
std::optional<Response> Existing(pqxx::work& tx, const Request& req, const std::string& hash,
                                 double retention_s) {
  if (retention_s > 0) Exec(tx, kKeepAlive, req.tenant_id, req.key, retention_s);
  auto rows = Exec(tx, kLoad, req.tenant_id, req.key);
  if (rows.empty()) return std::nullopt;  // the claimant rolled back; claim again
  const auto& row = rows[0];
  auto status = ParseKeyStatus(row[0].as<std::string>());
  Response stored{row[2].as<int>(0), row[4].as<std::string>(""), row[3].as<std::string>(""), false,
                  Outcome::kCancelled};
  if (status == KeyStatus::kTombstone) return stored;  // compensated before it arrived: refuse
  const auto headers = nlohmann::json::parse(row[6].as<std::string>());  // outlives items()
  for (const auto& [name, value] : headers.items()) {
    if (value.is_string()) stored.headers[name] = value.get<std::string>();
  }
  if (row[1].as<std::string>() != hash) return Refuse(Refusal::kKeyReused);
  // An external call under a live lease.
  if (status == KeyStatus::kPending) return Refuse(Refusal::kKeyPending);
  // Replaying the success of an undone action would tell a late retry (say, of a parent
  // whose key expired) that the effect is in place.
  if (row[5].as<bool>()) return Refuse(Refusal::kCompensated);
  stored.replayed = true;
  stored.outcome = Outcome::kReplayed;
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

std::string HeadersJson(const Response& res) { return nlohmann::json(res.headers).dump(); }

void Store(pqxx::work& tx, const Request& req, const Response& res) {
  Exec(tx, kStore, req.tenant_id, req.key, res.status, res.content_type, res.body,
       HeadersJson(res));
}

bool IsLockTimeout(const pqxx::sql_error& e) { return e.sqlstate() == "55P03"; }

// What a compensation finds of the action it undoes, in its transaction: the answer's
// outcome when there is nothing to undo (writing the tombstone when the action never
// arrived), else nullopt and `action` to undo. An external action still pending under a live
// lease throws ActionPending (never undo half a call); one whose lease ran out is cut off when
// `cut_off` (the undo is then told its outcome is unknown: status 0). Throws ActionUnknown.
std::optional<Outcome> FindAction(pqxx::work& tx, const Request& req, const std::string& action_key,
                                  bool action_applied, double retention_s, bool cut_off,
                                  ActionRecord& action) {
  std::string refusal = Refuse(Refusal::kTombstone).body;
  Exec(tx, kKeepAlive, req.tenant_id, action_key, retention_s);
  if (action_applied && Exec(tx, kLoad, req.tenant_id, action_key).empty()) {
    // The caller saw this action succeed, yet it has no record here (expired, restored from
    // an old backup): nothing can be undone, and a tombstone would make that final. Answer
    // without storing anything, so a retry after the record is restored undoes it.
    throw ActionUnknown();
  }
  if (!Exec(tx, kTombstone, req.tenant_id, action_key, refusal, retention_s).empty()) {
    return Outcome::kCancelled;
  }
  // The action committed (the tombstone insert waited for it if it was in flight).
  auto row = Exec(tx, kLockAction, req.tenant_id, action_key)[0];
  auto status = ParseKeyStatus(row[0].as<std::string>());
  int action_status = row[1].as<int>(0);
  if (status == KeyStatus::kTombstone) return Outcome::kCancelled;
  if (status == KeyStatus::kPending) {
    if (!cut_off || !row[4].as<bool>()) throw ActionPending();
    Exec(tx, kCutOffPending, req.tenant_id, action_key, Refuse(Refusal::kCutOff).body, retention_s);
    action = {action_key, 0, nullptr};
    return std::nullopt;
  }
  if (row[3].as<bool>()) return Outcome::kAlreadyUndone;
  if (action_status < 200 || action_status > 299) return Outcome::kNothingToUndo;
  action = {action_key, action_status,
            nlohmann::json::parse(row[2].as<std::string>(), nullptr, false)};
  return std::nullopt;
}

Response Undone(nlohmann::json body, Outcome outcome, const nlohmann::json& detail) {
  body["outcome"] = ToString(outcome);
  if (detail.is_object()) body.update(detail);
  return Response{200, body.dump(), "application/json", false, outcome};
}

// The business effect, on the transaction that stores its answer; `span` is left open.
// An answer about to be stored: what its effect span says of it.
Response Applied(Response res, common::trace::Span& span) {
  res.replayed = false;
  res.outcome = Outcome::kApplied;
  span.Set("http.status_code", static_cast<long long>(res.status));
  if (res.status >= 400) {
    span.Error("refused (stored and replayed)");
  } else {
    span.Ok();
  }
  return res;
}

Response ApplyEffect(pqxx::work& tx, const Guard::Effect& effect, common::trace::Span& span) {
  return Applied(effect(tx), span);
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

std::optional<Duplicates> ParseDuplicates(std::string_view name) {
  if (name == "wait") return Duplicates::kWait;
  if (name == "fail-fast") return Duplicates::kFailFast;
  return std::nullopt;
}

template <typename Body>
Response Guard::InTransaction(const Request& req, const Body& body) {
  struct KeyBusy {};
  for (int attempt = 1;; ++attempt) {
    try {
      return pool_.With([&](pqxx::connection& conn) {
        pqxx::work tx(conn);
        if (options_.duplicates == Duplicates::kFailFast &&
            !Exec(tx, kTryKeyLock, req.tenant_id, req.key)[0][0].as<bool>()) {
          throw KeyBusy{};
        }
        Response res = body(tx);
        auto commit = StartSpan("guard commit", req);
        tx.commit();  // a read-only commit when `body` answered from what was stored
        commit.Set("outcome", std::string(ToString(res.outcome))).Ok();
        return res;
      });
    } catch (const pqxx::transaction_rollback&) {
      if (attempt >= kRaceAttempts) throw;
    } catch (const KeyBusy&) {
      // Whoever holds the lock may only be reading a finished key (a replay): what is stored
      // answers this request too. Only a key still being written is in progress. A read
      // only (no keep-alive, which would wait on the holder's row lock).
      std::optional<Response> stored;
      try {
        stored = pool_.With([&](pqxx::connection& conn) {
          pqxx::work tx(conn);
          return Existing(tx, req, Fingerprint(req), 0);
        });
      } catch (const pqxx::sql_error&) {
        // Answered as busy below; a retry finds the key settled.
      }
      if (stored && stored->outcome != Outcome::kInProgress) return *stored;
      return Refuse(Refusal::kKeyBusy);
    } catch (const ActionUnknown&) {
      return Refuse(Refusal::kActionUnknown);
    } catch (const ActionPending&) {
      return Refuse(Refusal::kActionPending);
    } catch (const pqxx::sql_error& e) {
      if (!IsLockTimeout(e)) throw;
      return Refuse(Refusal::kKeyLockTimeout);
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
                 res.body, RetentionSeconds(), HeadersJson(res))
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
      claim.Set("outcome", std::string(ToString(answered->outcome)));
      if (answered->outcome == Outcome::kReused) claim.Error("key reused with another request");
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

namespace {

std::string Ctes(const PlannedEffect& plan) {
  return plan.ctes.empty() ? std::string() : ",\n" + plan.ctes;
}

// The plan's statement after the key's INSERT (parameters numbered after the plan's own): the
// effect reads `claimed`, so it applies exactly when the key was claimed, in the same implicit
// transaction. Data-modifying CTEs always run to completion, read or not.
// A plan with `otherwise` turns this around: `claimed` is the key found free in the
// statement's snapshot, the effect runs on that, and the key is written after it, only when
// the effect returned a row. A key that a concurrent request wrote meanwhile makes that INSERT
// a unique violation, which undoes the effect with it.
// Either answers one row: whether the key was free, and whether it was stored.
std::string PlannedSql(const PlannedEffect& plan) {
  const size_t n = plan.params.size();
  if (plan.otherwise) {
    return "WITH claimed AS (SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys\n"
           "  WHERE tenant_id = $" +
           std::to_string(n + 1) + " AND idempotency_key = $" + std::to_string(n + 2) + "))" +
           Ctes(plan) + ",\neffect AS (" + plan.sql + "),\nstored AS (\n" +
           InsertAnsweredSql(n, "EXISTS (SELECT 1 FROM effect)") +
           ")\nSELECT (SELECT count(*) FROM claimed), (SELECT count(*) FROM stored)";
  }
  std::string sql = "WITH claimed AS (\n" + InsertAnsweredSql(n) + ")" + Ctes(plan);
  if (!plan.sql.empty()) sql += ",\neffect AS (" + plan.sql + ")";
  return sql + "\nSELECT count(*), count(*) FROM claimed";
}

// The plan as an ordinary effect, for the transaction that answers a key already there.
Response ApplyPlan(pqxx::work& tx, const PlannedEffect& plan) {
  if (!plan.sql.empty()) {
    const common::pg::Statement effect("WITH claimed AS (SELECT 1)" + Ctes(plan) + "\n" + plan.sql);
    Exec(tx, effect, pqxx::prepare::make_dynamic_params(plan.params));
  }
  return plan.answer;
}

// The guard's own parameters follow the plan's, so a plan that used one more than it passes
// would read the tenant or the key in its place; and an effect not gated by `claimed` would
// apply on every retry. Both are refused before anything runs.
void CheckPlan(const PlannedEffect& plan) {
  if (plan.params.size() > 64) {
    throw std::invalid_argument("a planned effect takes at most 64 parameters");
  }
  if (plan.sql.empty()) {
    if (!plan.ctes.empty()) throw std::invalid_argument("a planned effect with `ctes` needs `sql`");
    return;
  }
  const std::string all = plan.ctes + "\n" + plan.sql;
  size_t highest = 0;
  for (size_t i = 0; i + 1 < all.size(); ++i) {
    if (all[i] != '$' || std::isdigit(static_cast<unsigned char>(all[i + 1])) == 0) continue;
    size_t n = 0;
    for (size_t j = i + 1; j < all.size() && std::isdigit(all[j]) != 0; ++j) {
      n = n * 10 + static_cast<size_t>(all[j] - '0');
      if (n > 1000) break;
    }
    highest = std::max(highest, n);
  }
  if (highest != plan.params.size()) {
    throw std::invalid_argument("a planned effect's SQL uses $" + std::to_string(highest) +
                                " but passes " + std::to_string(plan.params.size()) +
                                " parameters");
  }
  if (all.find("claimed") == std::string::npos) {
    throw std::invalid_argument("a planned effect's SQL must read from `claimed`");
  }
  if (!plan.otherwise) return;
  // What the key's INSERT reads to know that the effect applied.
  std::string lower = plan.sql;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("returning") == std::string::npos) {
    throw std::invalid_argument("a planned effect with `otherwise` must have a RETURNING clause");
  }
}

}  // namespace

Response Guard::RunPlanned(const Request& req, const PlannedEffect& plan) {
  CheckPlan(plan);
  // With `otherwise`: a key found taken is answered from the key (claimed first, so
  // `otherwise` is called only for a key this request owns); an effect that found nothing is
  // decided by `otherwise` before the key is written, as the planned statement orders its
  // locks (its rows, then the key), so a duplicate on the planned path cannot deadlock with it.
  auto fallback = [&](EffectScope otherwise_scope) {
    if (plan.otherwise) return Run(req, plan.otherwise, otherwise_scope);
    return Run(
        req, [&](pqxx::work& tx) { return ApplyPlan(tx, plan); }, EffectScope::kTransactionOnly);
  };
  if (options_.duplicates != Duplicates::kWait) return fallback(EffectScope::kAny);
  // Nothing planned: every duplicate takes this path, so no lock order to keep.
  if (plan.otherwise && plan.sql.empty()) return fallback(EffectScope::kAny);
  const std::string hash = Fingerprint(req);
  const common::pg::Statement statement(PlannedSql(plan));
  const Response& res = plan.answer;
  try {
    auto span = StartSpan("business effect", req);
    auto [key_free, stored] = pool_.With([&](pqxx::connection& conn) {
      pqxx::nontransaction tx(conn);  // one statement: its own transaction
      auto row = Exec(tx, statement, pqxx::prepare::make_dynamic_params(plan.params), req.tenant_id,
                      req.key, hash, res.status, res.content_type, res.body, RetentionSeconds(),
                      HeadersJson(res))[0];
      return std::pair{row[0].as<long long>() == 1, row[1].as<long long>() == 1};
    });
    if (stored) {
      // The statement committed the key with the effect: its span covers the commit, so no
      // "guard commit" span of its own (two spans fewer per order to make, ship and store).
      span.Set("in_statement", true);
      Response answer = Applied(res, span);
      span.End();
      return answer;
    }
    if (key_free) {
      span.Set("outcome", std::string("nothing applied: the effect found nothing to do"));
      span.End();
      return fallback(EffectScope::kTransactionOnly);
    }
    span.Set("outcome", std::string("nothing applied: the key was taken"));
  } catch (const pqxx::unique_violation&) {
    // The key, written by a duplicate meanwhile, or the effect's own unique index: the key is
    // probably taken, and answered below.
  } catch (const pqxx::transaction_rollback&) {
    // A deadlock with a transaction taking the same rows in the other order: nothing
    // committed; answered below, where such a rollback is retried.
  } catch (const pqxx::sql_error& e) {
    if (!IsLockTimeout(e)) throw;
    // A duplicate in flight held the key past the lock timeout: as InTransaction answers it.
    return Refuse(Refusal::kKeyLockTimeout);
  }
  return fallback(EffectScope::kAny);
}

Response Guard::Compensate(const Request& req, const std::string& action_key, const Undo& undo,
                           bool action_applied) {
  const std::string hash = Fingerprint(req);
  return InTransaction(req, [&](pqxx::work& tx) {
    auto claim = StartSpan("guard claim", req);
    if (auto answered = ClaimOrReplay(tx, req, hash, RetentionSeconds())) {
      claim.Set("outcome", std::string(ToString(answered->outcome)));
      return *answered;
    }
    claim.Set("outcome", std::string("claimed")).Ok();
    claim.End();
    auto undo_span = StartSpan("compensation effect", req);
    undo_span.Set("action_key", action_key).Set("compensation", true);
    ActionRecord action;
    auto found = FindAction(tx, req, action_key, action_applied, RetentionSeconds(), false, action);
    Response res;
    if (found) {
      res = Undone({{"action_key", action_key}}, *found, nullptr);
    } else {
      nlohmann::json detail = undo(tx, action);
      Exec(tx, kMarkCompensated, req.tenant_id, action_key, RetentionSeconds());
      res = Undone({{"action_key", action_key}}, Outcome::kUndone, detail);
    }
    undo_span.Set("undo.outcome", std::string(ToString(res.outcome))).Ok();
    undo_span.End();
    Store(tx, req, res);
    return res;
  });
}

template <typename Claimed, typename Call, typename Record>
Response Guard::External(const Request& req, const Claimed& claimed, const Call& call,
                         const Record& record) {
  using Clock = std::chrono::steady_clock;
  const std::string hash = Fingerprint(req);
  const double lease_s = static_cast<double>(options_.lease.count());
  struct Owned {
    long long token;
    bool earlier;
    Clock::time_point lease_end;  // no later than the database's lease expiry
  };
  std::optional<Owned> owned;
  // 1. Claim the key (or take over an expired claim), or answer from it: one short transaction.
  Response answered = InTransaction(req, [&](pqxx::work& tx) -> Response {
    owned.reset();
    const auto claimed_at = Clock::now();
    auto span = StartSpan("guard claim", req);
    bool earlier = false;
    auto rows = Exec(tx, kClaimPending, req.tenant_id, req.key, hash, lease_s, RetentionSeconds());
    if (rows.empty()) {
      rows = Exec(tx, kTakeOverPending, req.tenant_id, req.key, hash, lease_s);
      earlier = true;
    }
    if (rows.empty()) {
      auto existing = Existing(tx, req, hash, RetentionSeconds());
      if (!existing) throw pqxx::serialization_failure("external claim raced with a rollback");
      span.Set("outcome", std::string(ToString(existing->outcome)));
      return *existing;
    }
    long long token = rows[0][0].as<long long>();
    span.Set("outcome", std::string(earlier ? "taken_over" : "claimed"))
        .Set("fencing_token", token)
        .Ok();
    if (auto now = claimed(tx, earlier)) {  // answered without calling out
      Exec(tx, kRecordExternal, req.tenant_id, req.key, token, now->status, now->content_type,
           now->body, HeadersJson(*now));
      return *now;
    }
    owned = Owned{token, earlier, claimed_at + options_.lease};
    return {};
  });
  if (!owned) return answered;
  if (owned->earlier) {
    common::Log("guard_takeover", {{"tenant", req.tenant_id},
                                   {"key", req.key},
                                   {"fencing_token", std::to_string(owned->token)}});
  }
  // 2. The call, with no transaction open, to end well before the lease does.
  Response res;
  {
    auto span = StartSpan("external effect", req);
    span.Set("fencing_token", owned->token).Set("earlier_attempt", owned->earlier);
    ExternalCall ext{req, owned->token, owned->earlier, owned->lease_end - options_.lease / 4};
    try {
      res = call(ext);
    } catch (const NotSent& e) {
      span.Error(std::string("not sent: ") + e.what());
      // Certainly not sent: the next request may take over at once.
      try {
        pool_.With([&](pqxx::connection& conn) {
          pqxx::nontransaction tx(conn);
          Exec(tx, kReleaseLease, req.tenant_id, req.key, owned->token);
        });
      } catch (const std::exception&) {
        // The lease runs out on its own.
      }
      throw;
    } catch (...) {
      // It may have reached the third party, or still be on its way there: the claim stays
      // until its lease runs out, so a retry cannot overtake it with a second call.
      span.Error("threw: it may have happened");
      throw;
    }
    if (res.status >= 500) {
      // A transient failure, not an answer to keep: retried with the key after the lease.
      span.Error("answered " + std::to_string(res.status) + ": not stored");
      throw std::runtime_error("the external effect answered " + std::to_string(res.status) +
                               "; nothing stored");
    }
    res.replayed = false;
    res.outcome = Outcome::kApplied;
    span.Set("http.status_code", static_cast<long long>(res.status)).Ok();
  }
  // 3. Record the answer, only under this caller's token. The answer exists now, so a failure
  // to store it (the database restarting, a lock wait) is retried while the lease lasts;
  // otherwise the next request would have to call the third party again.
  auto wait = std::chrono::milliseconds(50);
  for (int attempt = 1;; ++attempt) {
    try {
      return pool_.With([&](pqxx::connection& conn) -> Response {
        pqxx::work tx(conn);
        auto span = StartSpan("guard record", req);
        if (Exec(tx, kRecordExternal, req.tenant_id, req.key, owned->token, res.status,
                 res.content_type, res.body, HeadersJson(res))
                .affected_rows() == 1) {
          record(tx);
          tx.commit();
          span.Set("outcome", std::string("stored")).Ok();
          return res;
        }
        // Taken over while this call was out (its lease ran out): a zombie's answer is not
        // stored.
        span.Set("outcome", std::string("fenced")).Error("the claim was taken over; not stored");
        common::Log("guard_fenced", {{"tenant", req.tenant_id},
                                     {"key", req.key},
                                     {"fencing_token", std::to_string(owned->token)}});
        auto now = Existing(tx, req, hash, RetentionSeconds());
        tx.commit();
        Response fenced = now ? *now : Refuse(Refusal::kClaimTakenOver);
        fenced.outcome = Outcome::kFenced;
        return fenced;
      });
    } catch (const std::exception& e) {
      if (attempt >= 8 || Clock::now() + wait >= owned->lease_end) {
        common::Log("guard_answer_lost", {{"tenant", req.tenant_id},
                                          {"key", req.key},
                                          {"fencing_token", std::to_string(owned->token)},
                                          {"http_status", std::to_string(res.status)},
                                          {"error", e.what()}});
        throw;
      }
      std::this_thread::sleep_for(wait);
      wait *= 2;
    }
  }
}

Response Guard::RunExternal(const Request& req, const ExternalEffect& effect) {
  return External(
      req, [](pqxx::work&, bool) -> std::optional<Response> { return std::nullopt; }, effect,
      [](pqxx::work&) {});
}

Response Guard::CompensateExternal(const Request& req, const std::string& action_key,
                                   const ExternalUndo& undo, bool action_applied) {
  ActionRecord action;
  return External(
      req,
      [&](pqxx::work& tx, bool) -> std::optional<Response> {
        auto found =
            FindAction(tx, req, action_key, action_applied, RetentionSeconds(), true, action);
        if (found) return Undone({{"action_key", action_key}}, *found, nullptr);
        return std::nullopt;
      },
      [&](const ExternalCall& call) {
        return Undone({{"action_key", action_key}}, Outcome::kUndone, undo(call, action));
      },
      [&](pqxx::work& tx) {
        Exec(tx, kMarkCompensated, req.tenant_id, action_key, RetentionSeconds());
      });
}

double Guard::RetentionSeconds() const { return static_cast<double>(options_.retention.count()); }

namespace {

// Every write sets expires_at to now() + retention, so a key written or compensated in the
// last `since` expires later than now() + retention - since.
const common::pg::Statement kListKeys{R"sql(
  SELECT idempotency_key, status, coalesce(response_status, 0), compensated_at IS NOT NULL,
         extract(epoch FROM now() - created_at)::float8
  FROM idempotency_keys
  WHERE tenant_id = $1 AND expires_at > now() + make_interval(secs => $2::float8 - $3::float8)
    AND idempotency_key > $4
  ORDER BY idempotency_key LIMIT $5)sql"};

}  // namespace

std::vector<KeyRecord> Guard::ListKeys(const std::string& tenant_id, std::chrono::seconds since,
                                       const std::string& after, int limit) {
  auto retention = std::chrono::duration_cast<std::chrono::seconds>(options_.retention);
  since = std::min(since, retention);
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    std::vector<KeyRecord> out;
    for (const auto& r : Exec(tx, kListKeys, tenant_id, static_cast<double>(retention.count()),
                              static_cast<double>(since.count()), after, limit)) {
      auto name = r[1].as<std::string>();
      auto status = ParseKeyStatus(name);
      if (!status) throw std::runtime_error("idempotency_keys holds a key status '" + name + "'");
      out.push_back(
          {r[0].as<std::string>(), *status, r[2].as<int>(), r[3].as<bool>(), r[4].as<double>()});
    }
    return out;
  });
}

long long Guard::DeleteExpired(int batch) {
  return pool_.With([&](pqxx::connection& conn) {
    pqxx::work tx(conn);
    auto r = Exec(tx, kDeleteExpired, batch);
    tx.commit();
    return static_cast<long long>(r.affected_rows());
  });
}

}  // namespace steps::guard
