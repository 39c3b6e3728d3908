// Guard::RunExternal and Guard::CompensateExternal: an effect outside the database, under a
// leased, fenced claim (see guard.hpp).
#include <thread>

#include "common/log.hpp"
#include "steps/guard/guard.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;
using detail::Decision;

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
  Response answered = InTransaction(req, [&](pqxx::work& tx) -> Decision {
    owned.reset();
    const auto claimed_at = Clock::now();
    auto span = StartSpan("guard claim", req);
    bool earlier = false;
    auto rows =
        Exec(tx, detail::kClaimPending, req.tenant_id, req.key, hash, lease_s, RetentionSeconds());
    if (rows.empty()) {
      rows = Exec(tx, detail::kTakeOverPending, req.tenant_id, req.key, hash, lease_s);
      earlier = true;
    }
    if (rows.empty()) {
      auto existing = detail::Existing(tx, req, hash, RetentionSeconds());
      if (!existing) return Decision::Race("external claim raced with a rollback");
      span.Set("outcome", std::string(protocol::ToString(existing->outcome)));
      return *existing;
    }
    long long token = rows[0][0].as<long long>();
    span.Set("outcome", std::string(earlier ? "taken_over" : "claimed"))
        .Set("fencing_token", token)
        .Ok();
    // Answered without calling out: stored (committed), or refused (rolled back).
    if (std::optional<Decision> now = claimed(tx, earlier)) {
      if (now->kind == Decision::Kind::kCommit) {
        Exec(tx, detail::kRecordExternal, req.tenant_id, req.key, token, now->answer.status,
             now->answer.content_type, now->answer.body, detail::HeadersJson(now->answer));
      }
      return *now;
    }
    owned = Owned{token, earlier, claimed_at + options_.lease};
    return Response{};
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
          Exec(tx, detail::kReleaseLease, req.tenant_id, req.key, owned->token);
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
    res.outcome = protocol::Outcome::kApplied;
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
        if (Exec(tx, detail::kRecordExternal, req.tenant_id, req.key, owned->token, res.status,
                 res.content_type, res.body, detail::HeadersJson(res))
                .affected_rows() == 1) {
          record(tx);
          tx.commit();
          span.Set("outcome", std::string("stored")).Ok();
          return res;
        }
        // Taken over while this call was out (its lease ran out): a zombie's answer is not
        // stored.
        span.Set("outcome", std::string(protocol::ToString(protocol::Outcome::kFenced)))
            .Error("the claim was taken over; not stored");
        common::Log("guard_fenced", {{"tenant", req.tenant_id},
                                     {"key", req.key},
                                     {"fencing_token", std::to_string(owned->token)}});
        auto now = detail::Existing(tx, req, hash, RetentionSeconds());
        tx.commit();
        Response fenced = now ? *now : Refuse(protocol::Refusal::kClaimTakenOver);
        fenced.outcome = protocol::Outcome::kFenced;
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
      req, [](pqxx::work&, bool) -> std::optional<Decision> { return std::nullopt; }, effect,
      [](pqxx::work&) {});
}

Response Guard::CompensateExternal(const Request& req, const std::string& action_key,
                                   const ExternalUndo& undo, bool action_applied) {
  ActionRecord action;
  return External(
      req,
      [&](pqxx::work& tx, bool) -> std::optional<Decision> {
        auto found =
            detail::FindAction(tx, req, action_key, action_applied, RetentionSeconds(), true);
        switch (found.kind) {
          case detail::Found::Kind::kRefused:
            return Decision::RollBack(Refuse(found.refusal));
          case detail::Found::Kind::kNothing:
            return Decision(detail::Undone(action_key, found.outcome, nullptr));
          case detail::Found::Kind::kUndo:
            break;
        }
        action = found.action;
        return std::nullopt;
      },
      [&](const ExternalCall& call) {
        return detail::Undone(action_key, protocol::Outcome::kUndone, undo(call, action));
      },
      [&](pqxx::work& tx) {
        Exec(tx, detail::kMarkCompensated, req.tenant_id, action_key, RetentionSeconds());
      });
}

}  // namespace idemsaga::steps::guard
