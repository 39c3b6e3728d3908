// Group commit of the parent store's two writes per saga: claims of new keys, and finishes.
// Concurrent callers' writes go in one statement per tenant (one round trip, one commit);
// each caller is answered after it, as alone. A batch the database refuses (a value one
// request carries, a deadlock with another replica's batch) rolled back whole, so its
// requests are written again one by one and each gets its own answer; an outage, or a
// commit whose fate is unknown, is every caller's, as it would be alone.
#include <algorithm>
#include <exception>
#include <map>
#include <set>
#include <span>

#include "common/group_commit.hpp"
#include "common/pg/statement.hpp"
#include "orchestrator/store/parent_rows.hpp"
#include "orchestrator/store/parent_store.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;
using detail::Seconds;

// kClaim (parent_store.cpp) for many keys of one tenant ($1), read from a JSON array ($2).
const common::pg::Statement kClaimBatch{R"sql(
  INSERT INTO idempotency_keys AS k
    (tenant_id, idempotency_key, request_hash, request_body, saga_name, order_id, status,
     lease_owner, lease_epoch, lease_expires_at, trace_id, expires_at, root_span_id,
     saga_version)
  SELECT $1, v.key, v.hash, v.body, v.saga, 'ord_' || replace(gen_random_uuid()::text, '-', ''),
         'started', v.owner, 1, now() + make_interval(secs => $3), v.trace,
         now() + make_interval(secs => $4), v.root_span, v.version
  FROM json_to_recordset($2::json)
       AS v(key text, hash text, body jsonb, saga text, owner text, trace text, root_span text,
            version int)
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING k.idempotency_key, k.order_id, k.lease_epoch, k.created_at::text,
            k.updated_at::text, extract(epoch FROM k.lease_expires_at - now())::float8,
            extract(epoch FROM k.expires_at - now())::float8)sql"};

// kFinish (parent_store.cpp) for many sagas of one tenant ($1); `i` numbers the requests, so
// that two finishes of one key (a fenced one among them) are told apart.
const common::pg::Statement kFinishBatch{R"sql(
  UPDATE idempotency_keys AS k
  SET status = v.status, response_status = v.response_status, response_body = v.response_body,
      response_headers = v.response_headers, steps = v.steps,
      stuck = false, lease_owner = NULL, lease_expires_at = NULL,
      completed_at = now(), updated_at = now(), expires_at = now() + make_interval(secs => $3)
  FROM json_to_recordset($2::json)
       AS v(i int, key text, owner text, epoch bigint, status text, response_status int,
            response_body text, response_headers jsonb, steps jsonb)
  WHERE k.tenant_id = $1 AND k.idempotency_key = v.key AND k.lease_owner = v.owner
    AND k.lease_epoch = v.epoch AND k.status NOT IN ('completed', 'failed')
  RETURNING v.i)sql"};

// The largest batch: a statement of 64 rows is still short, and a larger one would make the
// first callers of a storm wait for the last. Two batches of each kind may be out at once, so
// that a caller waits for at most part of another's commit (one at a time made a closed loop
// of 16 connections 14 % slower: each claim waited for the batch before it, then its own).
constexpr size_t kMaxBatch = 64;
constexpr size_t kMaxInflight = 2;

// One caller's answer: a request written again alone may fail alone.
template <typename T>
struct Answer {
  T value{};
  std::exception_ptr error;
  T Get() && {
    if (error) std::rethrow_exception(error);
    return std::move(value);
  }
};

template <typename T, typename Fn>
Answer<T> Alone(Fn&& fn) {
  try {
    return {fn(), nullptr};
  } catch (...) {
    return {T{}, std::current_exception()};
  }
}

// Requests of a batch grouped by tenant (one statement each), in a fixed order: two replicas'
// batches that share keys lock them in the same order and cannot deadlock each other.
template <typename Req, typename TenantOf>
std::map<std::string, std::vector<size_t>> ByTenant(std::span<const Req* const> batch,
                                                    TenantOf tenant_of) {
  std::map<std::string, std::vector<size_t>> groups;
  for (size_t i = 0; i < batch.size(); ++i) groups[tenant_of(*batch[i])].push_back(i);
  return groups;
}

}  // namespace

class ParentStore::Batches {
 public:
  explicit Batches(ParentStore& store)
      : store_(store),
        claims_(kMaxBatch, kMaxInflight,
                [this](std::span<const ClaimRequest* const> b) { return ClaimAll(b); }),
        finishes_(kMaxBatch, kMaxInflight,
                  [this](std::span<const FinishRequest* const> b) { return FinishAll(b); }) {}

  std::optional<SagaRow> Claim(const ClaimRequest& req) { return claims_.Submit(req).Get(); }
  bool Finish(const FinishRequest& f) { return finishes_.Submit(f).Get(); }
  WriteBatches ClaimStats() { return Of(claims_.stats()); }
  WriteBatches FinishStats() { return Of(finishes_.stats()); }

 private:
  using ClaimAnswer = Answer<std::optional<SagaRow>>;
  using FinishAnswer = Answer<bool>;

  std::vector<ClaimAnswer> ClaimAll(std::span<const ClaimRequest* const> batch) {
    std::vector<ClaimAnswer> out(batch.size());
    auto alone = [&](size_t i) {
      out[i] = Alone<std::optional<SagaRow>>([&] { return store_.ClaimOne(*batch[i]); });
    };
    if (batch.size() == 1) {
      alone(0);
      return out;
    }
    auto groups = ByTenant(batch, [](const ClaimRequest& r) { return r.tenant_id; });
    for (auto& [tenant, members] : groups) {
      // A key twice in one batch: the first claims it, the others find it taken, as they
      // would one after the other.
      std::map<std::string, size_t> first;
      for (size_t i : members) first.emplace(batch[i]->key, i);
      try {
        ClaimGroup(tenant, batch, first, out);
      } catch (const pqxx::sql_error&) {
        for (const auto& [key, i] : first) alone(i);
      } catch (const nlohmann::json::exception&) {  // text JSON cannot carry: alone
        for (const auto& [key, i] : first) alone(i);
      }
      // The later duplicates of a key, after the first's write: they find it taken.
      for (size_t i : members) {
        if (first.at(batch[i]->key) != i) out[i] = ClaimAnswer{};
      }
    }
    return out;
  }

  void ClaimGroup(const std::string& tenant, std::span<const ClaimRequest* const> batch,
                  const std::map<std::string, size_t>& first, std::vector<ClaimAnswer>& out) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& [key, i] : first) {  // key order
      const ClaimRequest& r = *batch[i];
      rows.push_back({{"key", r.key},
                      {"hash", r.request_hash},
                      {"body", r.request_body},
                      {"saga", r.saga_name},
                      {"owner", r.owner},
                      {"trace", r.trace_id},
                      {"root_span",
                       r.root_span_id.empty() ? nlohmann::json() : nlohmann::json(r.root_span_id)},
                      {"version", r.saga_version}});
    }
    auto text = rows.dump();
    const auto& o = store_.options_;
    auto result = store_.OneStatement([&](pqxx::nontransaction& tx) {
      return Exec(tx, kClaimBatch, tenant, text, Seconds(o.lease),
                  Seconds(std::chrono::duration_cast<std::chrono::seconds>(o.retention)));
    });
    for (const auto& row : result) {
      auto it = first.find(row[0].as<std::string>());
      if (it != first.end()) {
        out[it->second].value = detail::ClaimedRow(*batch[it->second], row, 1);
      }
    }
  }

  std::vector<FinishAnswer> FinishAll(std::span<const FinishRequest* const> batch) {
    std::vector<FinishAnswer> out(batch.size());
    auto alone = [&](size_t i) {
      out[i] = Alone<bool>([&] { return store_.FinishOne(*batch[i]); });
    };
    if (batch.size() == 1) {
      alone(0);
      return out;
    }
    auto groups = ByTenant(batch, [](const FinishRequest& f) { return f.lease.tenant_id; });
    for (auto& [tenant, members] : groups) {
      std::sort(members.begin(), members.end(),
                [&](size_t a, size_t b) { return batch[a]->lease.key < batch[b]->lease.key; });
      try {
        FinishGroup(tenant, batch, members, out);
      } catch (const pqxx::sql_error&) {
        for (size_t i : members) alone(i);
      } catch (const nlohmann::json::exception&) {
        for (size_t i : members) alone(i);
      }
    }
    return out;
  }

  void FinishGroup(const std::string& tenant, std::span<const FinishRequest* const> batch,
                   const std::vector<size_t>& members, std::vector<FinishAnswer>& out) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i : members) {
      const FinishRequest& f = *batch[i];
      rows.push_back({{"i", i},
                      {"key", f.lease.key},
                      {"owner", f.lease.owner},
                      {"epoch", f.lease.epoch},
                      {"status", f.status},
                      {"response_status", f.response_status},
                      {"response_body", f.response_body},
                      {"response_headers", f.response_headers},
                      {"steps", f.steps}});
    }
    auto text = rows.dump();
    auto retention = std::chrono::duration_cast<std::chrono::seconds>(store_.options_.retention);
    auto result = store_.OneStatement([&](pqxx::nontransaction& tx) {
      return Exec(tx, kFinishBatch, tenant, text, Seconds(retention));
    });
    for (const auto& row : result) {
      auto i = row[0].as<size_t>();
      if (i < out.size()) out[i].value = true;
    }
  }

  template <typename Stats>
  static WriteBatches Of(const Stats& s) {
    return {s.requests, s.batches, s.largest};
  }

  ParentStore& store_;
  common::GroupCommit<ClaimRequest, ClaimAnswer> claims_;
  common::GroupCommit<FinishRequest, FinishAnswer> finishes_;
};

ParentStore::ParentStore(common::pg::Pool& pool, StoreOptions options)
    : pool_(pool), options_(options), batches_(std::make_unique<Batches>(*this)) {}

ParentStore::~ParentStore() = default;

std::optional<SagaRow> ParentStore::ClaimBatched(const ClaimRequest& req) {
  return batches_->Claim(req);
}

bool ParentStore::FinishBatched(const FinishRequest& f) { return batches_->Finish(f); }

ParentStore::WriteBatches ParentStore::claim_batches() { return batches_->ClaimStats(); }

ParentStore::WriteBatches ParentStore::finish_batches() { return batches_->FinishStats(); }

}  // namespace idemsaga::orchestrator::store
