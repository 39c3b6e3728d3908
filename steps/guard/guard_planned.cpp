// Guard::RunPlanned: an effect planned in advance, committed with its key in one statement.
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "steps/guard/guard.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::pg::Exec;

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
           detail::InsertAnsweredSql(n, "EXISTS (SELECT 1 FROM effect)") +
           ")\nSELECT (SELECT count(*) FROM claimed), (SELECT count(*) FROM stored)";
  }
  std::string sql = "WITH claimed AS (\n" + detail::InsertAnsweredSql(n) + ")" + Ctes(plan);
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
                      detail::HeadersJson(res))[0];
      return std::pair{row[0].as<long long>() == 1, row[1].as<long long>() == 1};
    });
    if (stored) {
      // The statement committed the key with the effect: its span covers the commit, so no
      // "guard commit" span of its own (two spans fewer per order to make, ship and store).
      span.Set("in_statement", true);
      Response answer = detail::Applied(res, span);
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
    if (!detail::IsLockTimeout(e)) throw;
    // A duplicate in flight held the key past the lock timeout: as InTransaction answers it.
    return Refuse(protocol::Refusal::kKeyLockTimeout);
  }
  return fallback(EffectScope::kAny);
}

}  // namespace idemsaga::steps::guard
