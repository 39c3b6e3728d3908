// The guard's insides, shared by its files and by nothing else: the statements
// (guard_sql.cpp), the claim and the replay (guard.cpp), what a compensation finds of its action
// (guard_compensation.cpp), and the transaction every mode runs in (Guard::InTransaction).
//
// The control flow returns values: a transaction's body says whether to commit, to roll back
// and answer, or to run again (Decision); no exception stands for an answer.
#pragma once

#include <optional>
#include <pqxx/pqxx>
#include <string>

#include "common/pg/pool.hpp"
#include "common/pg/statement.hpp"
#include "common/unavailable.hpp"
#include "steps/guard/guard.hpp"

namespace idemsaga::steps::guard::detail {

// guard_sql.cpp: every statement on idempotency_keys.
extern const common::pg::Statement kClaim;
extern const common::pg::Statement kTryKeyLock;
extern const common::pg::Statement kInsertAnswered;
extern const common::pg::Statement kLoad;
extern const common::pg::Statement kClaimPending;
extern const common::pg::Statement kTakeOverPending;
extern const common::pg::Statement kRecordExternal;
extern const common::pg::Statement kReleaseLease;
extern const common::pg::Statement kStore;
extern const common::pg::Statement kTombstone;
extern const common::pg::Statement kKeepAlive;
extern const common::pg::Statement kLockAction;
extern const common::pg::Statement kCutOffPending;
extern const common::pg::Statement kMarkCompensated;
extern const common::pg::Statement kDeleteExpired;
extern const common::pg::Statement kListKeys;

// Stores the key and its answer in one row, after the effect: the first writer of the key.
// Its 8 parameters are numbered from $(after + 1): RunPlanned puts it after a plan's own.
// With `when`, the row is written only if that condition holds, and a key written meanwhile
// is a unique violation rather than a row skipped: what the statement did with it rolls back.
std::string InsertAnsweredSql(size_t after, const char* when = nullptr);

// A transaction that lost a serialization or deadlock race is run again at once; it stored
// nothing. Anything else (including an in-doubt commit) goes to the caller.
constexpr int kRaceAttempts = 3;

// What a transaction's body decided.
struct Decision {
  enum class Kind {
    kCommit,    // commit, then answer `answer`
    kRollBack,  // answer `answer` with nothing written (a refusal that must not be stored)
    kRace,      // roll back and run again: a key vanished between two statements (its
                // claimant rolled back); past kRaceAttempts the caller gets
                // common::Unavailable, answered as a race PostgreSQL reports is (503)
  };
  Kind kind = Kind::kCommit;
  Response answer;
  const char* race = "";  // what raced, for kRace

  Decision(Response res) : answer(std::move(res)) {}  // NOLINT: a plain answer commits
  static Decision RollBack(Response res) {
    Decision d(std::move(res));
    d.kind = Kind::kRollBack;
    return d;
  }
  static Decision Race(const char* what) {
    Decision d(Response{});
    d.kind = Kind::kRace;
    d.race = what;
    return d;
  }
};

// What an earlier request left under the key: a replay, a refusal, or nothing (not claimed:
// its claimant rolled back). `retention_s` <= 0: read only (the key's expiry is not moved).
std::optional<Response> Existing(pqxx::work& tx, const Request& req, const std::string& hash,
                                 double retention_s);

// The claim of a key (Run, Compensate): ours now, or answered from what is stored, or raced.
struct Claim {
  enum class Kind { kOwned, kAnswered, kRaced } kind = Kind::kOwned;
  Response answer;  // kAnswered
};
Claim ClaimOrReplay(pqxx::work& tx, const Request& req, const std::string& hash,
                    double retention_s);

// Duplicates::kFailFast found the key's lock held: what is stored, when it is a finished key
// the holder only reads, else 409 in progress.
Response AnswerBusy(common::pg::Pool& pool, const Request& req);

std::string HeadersJson(const Response& res);
void Store(pqxx::work& tx, const Request& req, const Response& res);
bool IsLockTimeout(const pqxx::sql_error& e);

// An answer about to be stored: stamped applied, and what its effect span says of it (the
// span is left open).
Response Applied(Response res, common::trace::Span& span);

// What a compensation finds of the action it undoes, in its transaction (FindAction).
struct Found {
  enum class Kind {
    kUndo,     // `action` is there to undo
    kNothing,  // nothing to undo: answered with `outcome` (cancelled: the tombstone is
               // written now, or was; already_undone; nothing_to_undo)
    kRefused,  // answer `refusal` and roll back: action_unknown, or an external action still
               // in flight (never undo half a call)
  };
  Kind kind = Kind::kUndo;
  protocol::Outcome outcome = protocol::Outcome::kNone;
  protocol::Refusal refusal = protocol::Refusal::kActionUnknown;
  ActionRecord action;
};
// An external action still pending under a live lease is refused (kActionPending); one whose
// lease ran out is cut off when `cut_off` (the undo is then told its outcome is unknown:
// status 0). `action_applied` and no record: kActionUnknown, nothing written.
Found FindAction(pqxx::work& tx, const Request& req, const std::string& action_key,
                 bool action_applied, double retention_s, bool cut_off);

// The part of the external lease protocol that the key-value stores (Redis, DynamoDB) share
// once a key is claimed under `token`: `call` runs with nothing held (NotSent runs `release`,
// best effort, and is rethrown; any other exception keeps the claim until its lease runs out);
// a 5xx stores nothing; the answer, stamped applied, goes to `record`, retried while the lease
// lasts, since otherwise the next request would have to call the third party again.
Response CallUnderLease(const Request& req, long long token, bool earlier,
                        std::chrono::seconds lease,
                        const std::function<Response(const ExternalCall&)>& call,
                        const std::function<void()>& release,
                        const std::function<Response(const Response&)>& record);

// A compensation's answer: 200 {"action_key", "outcome", ...detail}.
Response Undone(const std::string& action_key, protocol::Outcome outcome,
                const nlohmann::json& detail);

}  // namespace idemsaga::steps::guard::detail

namespace idemsaga::steps::guard {

template <typename Body>
Response Guard::InTransaction(const Request& req, const Body& body) {
  using detail::Decision;
  for (int attempt = 1;; ++attempt) {
    std::optional<Decision> decided;  // nullopt: another request holds the key's lock
    try {
      decided = pool_.With([&](pqxx::connection& conn) -> std::optional<Decision> {
        pqxx::work tx(conn);
        if (options_.duplicates == Duplicates::kFailFast &&
            !common::pg::Exec(tx, detail::kTryKeyLock, req.tenant_id, req.key)[0][0].as<bool>()) {
          return std::nullopt;  // `tx` rolls back
        }
        Decision d = body(tx);
        if (d.kind != Decision::Kind::kCommit) return d;  // `tx` rolls back
        auto commit = StartSpan("guard commit", req);
        tx.commit();  // a read-only commit when `body` answered from what was stored
        commit.Set("outcome", std::string(protocol::ToString(d.answer.outcome))).Ok();
        return d;
      });
    } catch (const pqxx::transaction_rollback&) {
      if (attempt >= detail::kRaceAttempts) throw;
      continue;
    } catch (const pqxx::sql_error& e) {
      if (!detail::IsLockTimeout(e)) throw;
      return Refuse(protocol::Refusal::kKeyLockTimeout);
    }
    if (!decided) return detail::AnswerBusy(pool_, req);
    if (decided->kind == Decision::Kind::kRace) {
      // Our own outage, not a library's exception made up: every edge answers it 503 +
      // Retry-After (common/failure.hpp), and nothing was stored, so the retry is safe.
      if (attempt >= detail::kRaceAttempts) throw common::Unavailable(decided->race);
      continue;
    }
    return std::move(decided->answer);
  }
}

}  // namespace idemsaga::steps::guard
