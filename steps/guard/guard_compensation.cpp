// Guard::Compensate, and what a compensation finds of the action it undoes (shared with
// CompensateExternal): undo it once, write a tombstone when it never arrived, or refuse.
#include "steps/guard/guard.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;
using detail::Decision;
using detail::Found;

namespace detail {

Found FindAction(pqxx::work& tx, const Request& req, const std::string& action_key,
                 bool action_applied, double retention_s, bool cut_off) {
  auto nothing = [](protocol::Outcome outcome) { return Found{Found::Kind::kNothing, outcome}; };
  auto refused = [](protocol::Refusal refusal) {
    return Found{Found::Kind::kRefused, protocol::Outcome::kNone, refusal};
  };
  Exec(tx, kKeepAlive, req.tenant_id, action_key, retention_s);
  if (action_applied && Exec(tx, kLoad, req.tenant_id, action_key).empty()) {
    // The caller saw this action succeed, yet it has no record here (expired, restored from
    // an old backup): nothing can be undone, and a tombstone would make that final. Answer
    // without storing anything, so a retry after the record is restored undoes it.
    return refused(protocol::Refusal::kActionUnknown);
  }
  if (!Exec(tx, kTombstone, req.tenant_id, action_key, Refuse(protocol::Refusal::kTombstone).body,
            retention_s)
           .empty()) {
    return nothing(protocol::Outcome::kCancelled);
  }
  // The action committed (the tombstone insert waited for it if it was in flight).
  auto row = Exec(tx, kLockAction, req.tenant_id, action_key)[0];
  auto status = protocol::ParseKeyStatus(row[0].as<std::string>());
  int action_status = row[1].as<int>(0);
  if (status == protocol::KeyStatus::kTombstone) return nothing(protocol::Outcome::kCancelled);
  if (status == protocol::KeyStatus::kPending) {
    // Never undo half a call: an external action under a live lease is still out.
    if (!cut_off || !row[4].as<bool>()) return refused(protocol::Refusal::kActionPending);
    Exec(tx, kCutOffPending, req.tenant_id, action_key, Refuse(protocol::Refusal::kCutOff).body,
         retention_s);
    Found undo;
    undo.action = {action_key, 0, nullptr};
    return undo;
  }
  if (row[3].as<bool>()) return nothing(protocol::Outcome::kAlreadyUndone);
  if (action_status < 200 || action_status > 299) return nothing(protocol::Outcome::kNothingToUndo);
  Found undo;
  undo.action = {action_key, action_status,
                 nlohmann::json::parse(row[2].as<std::string>(), nullptr, false)};
  return undo;
}

Response Undone(const std::string& action_key, protocol::Outcome outcome,
                const nlohmann::json& detail) {
  return Response{200, protocol::CompensationBody(action_key, outcome, detail), "application/json",
                  false, outcome};
}

}  // namespace detail

Response Guard::Compensate(const Request& req, const std::string& action_key, const Undo& undo,
                           bool action_applied) {
  const std::string hash = Fingerprint(req);
  return InTransaction(req, [&](pqxx::work& tx) -> Decision {
    auto claim = StartSpan("guard claim", req);
    auto claimed = detail::ClaimOrReplay(tx, req, hash, RetentionSeconds());
    if (claimed.kind == detail::Claim::Kind::kRaced) {
      return Decision::Race("idempotency key claim raced with a rollback");
    }
    if (claimed.kind == detail::Claim::Kind::kAnswered) {
      claim.Set("outcome", std::string(protocol::ToString(claimed.answer.outcome)));
      return claimed.answer;
    }
    claim.Set("outcome", std::string("claimed")).Ok();
    claim.End();
    auto undo_span = StartSpan("compensation effect", req);
    undo_span.Set("action_key", action_key).Set("compensation", true);
    Found found =
        detail::FindAction(tx, req, action_key, action_applied, RetentionSeconds(), false);
    if (found.kind == Found::Kind::kRefused) return Decision::RollBack(Refuse(found.refusal));
    Response res;
    if (found.kind == Found::Kind::kNothing) {
      res = detail::Undone(action_key, found.outcome, nullptr);
    } else {
      nlohmann::json details = undo(tx, found.action);
      Exec(tx, detail::kMarkCompensated, req.tenant_id, action_key, RetentionSeconds());
      res = detail::Undone(action_key, protocol::Outcome::kUndone, details);
    }
    undo_span.Set("undo.outcome", std::string(protocol::ToString(res.outcome))).Ok();
    undo_span.End();
    detail::Store(tx, req, res);
    return res;
  });
}

}  // namespace idemsaga::steps::guard
