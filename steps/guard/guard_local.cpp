// Guard::Run: an effect on the guard's own transaction, claimed first (EffectScope::kAny) or
// applied first with the key written after it (EffectScope::kTransactionOnly).
#include "steps/guard/guard.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;
using detail::Decision;

Response Guard::Run(const Request& req, const Effect& effect, EffectScope scope) {
  const std::string hash = Fingerprint(req);
  if (scope == EffectScope::kTransactionOnly) {
    bool key_taken = false;  // the effect rolled back: answered below, from the key
    try {
      Response res = InTransaction(req, [&](pqxx::work& tx) -> Decision {
        key_taken = false;
        auto span = StartSpan("business effect", req);
        Response res = detail::Applied(effect(tx), span);
        if (Exec(tx, detail::kInsertAnswered, req.tenant_id, req.key, hash, res.status,
                 res.content_type, res.body, RetentionSeconds(), detail::HeadersJson(res))
                .empty()) {
          span.Set("outcome", std::string("rolled back: the key was taken"));
          key_taken = true;
          return Decision::RollBack({});
        }
        return res;
      });
      if (!key_taken) return res;
    } catch (const pqxx::unique_violation&) {
      // The effect's own unique index (a charge per key) names a key that is probably taken:
      // below, the claim finds out, and an effect that trips again throws from there.
    }
  }
  return InTransaction(req, [&](pqxx::work& tx) -> Decision {
    auto claim = StartSpan("guard claim", req);
    auto claimed = detail::ClaimOrReplay(tx, req, hash, RetentionSeconds());
    if (claimed.kind == detail::Claim::Kind::kRaced) {
      return Decision::Race("idempotency key claim raced with a rollback");
    }
    if (claimed.kind == detail::Claim::Kind::kAnswered) {
      claim.Set("outcome", std::string(protocol::ToString(claimed.answer.outcome)));
      if (claimed.answer.outcome == protocol::Outcome::kReused)
        claim.Error("key reused with another request");
      return claimed.answer;
    }
    claim.Set("outcome", std::string("claimed")).Ok();
    claim.End();
    auto span = StartSpan("business effect", req);
    Response res = detail::Applied(effect(tx), span);
    span.End();
    detail::Store(tx, req, res);
    return res;
  });
}

}  // namespace idemsaga::steps::guard
