// ParentStore: a key's claim, its lease (takeover, renewal, set-aside, release) and its finish,
// and reading one row back; the listing is parent_listing.cpp, garbage collection
// parent_gc.cpp, tenants parent_tenants.cpp (parent_store.hpp is the contract).
#include "orchestrator/store/parent_store.hpp"

#include <stdexcept>

#include "common/log.hpp"
#include "common/pg/statement.hpp"
#include "common/strings.hpp"
#include "common/unavailable.hpp"
#include "orchestrator/store/parent_rows.hpp"

namespace idemsaga::orchestrator::store {
namespace {

using common::pg::Exec;
using detail::kColumns;
using detail::Seconds;
using detail::ToRow;

// Claims a new key in one round trip and returns only what the database chose (the rest of
// the row is the request). A key already there is not written or locked: ON CONFLICT DO
// NOTHING's check finds it before anything is inserted; a second statement (kGet) reads it.
// One statement doing both (a CTE that reads the key, then inserts) cost a claim about a fifth
// more PostgreSQL CPU: its plan, with the whole row's 26 output expressions, is started again
// at every execution, and new keys are nearly all claims.
// An order id is 32 hex digits: the milliseconds since the epoch (12), then 80 random bits, as
// a UUIDv7 has them, so that new orders' entries in the order_id index land beside each other
// (see NewTraceId in common/trace/trace_context.cpp).
const common::pg::Statement kClaim{R"sql(
  INSERT INTO idempotency_keys AS k
    (tenant_id, idempotency_key, request_hash, request_body, saga_name, order_id, status,
     lease_owner, lease_epoch, lease_expires_at, trace_id, expires_at, root_span_id,
     saga_version)
  VALUES ($1, $2, $3, $4::jsonb, $5,
          'ord_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
                 || left(replace(gen_random_uuid()::text, '-', ''), 20),
          'started', $6, 1, now() + make_interval(secs => $7), $8,
          now() + make_interval(secs => $9), $10, $11)
  ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
  RETURNING k.order_id, k.lease_epoch, k.created_at::text, k.updated_at::text,
            extract(epoch FROM k.lease_expires_at - now())::float8,
            extract(epoch FROM k.expires_at - now())::float8)sql"};

const common::pg::Statement kGet{
    std::string("SELECT ") + kColumns +
    " FROM idempotency_keys k WHERE tenant_id = $1 AND idempotency_key = $2"};

// One conditional UPDATE: of all the processes that see the lease expired, exactly one wins.
const common::pg::Statement kTakeOver{std::string(R"sql(
  UPDATE idempotency_keys k
  SET lease_owner = $3, lease_epoch = lease_epoch + 1, stuck = false, waiting_for = NULL,
      lease_expires_at = now() + make_interval(secs => $4), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2
    AND status NOT IN ('completed', 'failed') AND lease_expires_at < now()
  RETURNING )sql") + kColumns};

// Also says whether an operator asked to cancel the saga: a replica that runs it learns so
// within a third of a lease, at no extra round trip.
const common::pg::Statement kRenew{R"sql(
  UPDATE idempotency_keys
  SET lease_expires_at = now() + make_interval(secs => $5), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND lease_owner = $3 AND lease_epoch = $4
    AND status NOT IN ('completed', 'failed')
  RETURNING cancel_requested IS NOT NULL)sql"};

const common::pg::Statement kBeginCompensation{R"sql(
  UPDATE idempotency_keys
  SET status = 'compensating', steps = $5::jsonb, failed_step = $6, failure = $7::jsonb,
      updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND lease_owner = $3 AND lease_epoch = $4
    AND status NOT IN ('compensating', 'completed', 'failed'))sql"};

// A saga set aside until its lease runs out: stuck (deferred), or waiting (parked: $8 the
// events that wake it sooner, "{}" for none). A running saga an operator has asked to cancel
// since its owner last looked wakes at once, to act on it (a cancel that commits after this
// wakes it itself: kRequestCancel).
const common::pg::Statement kSetAside{R"sql(
  UPDATE idempotency_keys
  SET stuck = $7, steps = $5::jsonb, updated_at = now(),
      waiting_for = CASE WHEN $7 THEN NULL ELSE $8::text[] END,
      lease_expires_at = CASE WHEN NOT $7 AND status = 'started' AND cancel_requested IS NOT NULL
                              THEN now() ELSE now() + make_interval(secs => $6) END
  WHERE tenant_id = $1 AND idempotency_key = $2 AND lease_owner = $3 AND lease_epoch = $4
    AND status NOT IN ('completed', 'failed'))sql"};

// A saga that has just parked for events takes its lease back if one was delivered meanwhile:
// a delivery committed before this statement began is seen here, and one committed after the
// park is seen by the delivery's own wake-up (EventStore::Deliver), so none is missed.
const common::pg::Statement kTakeBackForEvent{R"sql(
  UPDATE idempotency_keys
  SET waiting_for = NULL, lease_expires_at = now() + make_interval(secs => $6), updated_at = now()
  WHERE tenant_id = $1 AND idempotency_key = $2 AND lease_owner = $3 AND lease_epoch = $4
    AND status NOT IN ('completed', 'failed')
    AND EXISTS (SELECT 1 FROM saga_events e
                WHERE e.tenant_id = $1 AND e.idempotency_key = $2 AND e.name = ANY($5::text[]))
  RETURNING 1)sql"};

// SKIP LOCKED: a row another sweeper is taking over right now is left to it.
const common::pg::Statement kTakeOverBatch{std::string(R"sql(
  UPDATE idempotency_keys k
  SET lease_owner = $1, lease_epoch = k.lease_epoch + 1, stuck = false, waiting_for = NULL,
      lease_expires_at = now() + make_interval(secs => $2), updated_at = now()
  FROM (SELECT tenant_id, idempotency_key FROM idempotency_keys
        WHERE status IN ('started', 'compensating') AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED) expired
  WHERE k.tenant_id = expired.tenant_id AND k.idempotency_key = expired.idempotency_key
  RETURNING )sql") + kColumns};

// A parked saga runs nowhere: its lease is its wake-up time, kept across the shutdown.
const common::pg::Statement kReleaseLeases{R"sql(
  UPDATE idempotency_keys SET lease_expires_at = now(), updated_at = now()
  WHERE lease_owner = $1 AND status IN ('started', 'compensating') AND waiting_for IS NULL)sql"};

// $11: span rows riding on the finish (span_rides.hpp), "{}" for none. They are written
// whether or not the lease still holds: they are not the saga's.
const common::pg::Statement kFinish{R"sql(
  WITH spans AS (INSERT INTO trace_spans (trace_id, spans) SELECT key, value FROM json_each($11::json))
  UPDATE idempotency_keys
  SET status = $5, response_status = $6, response_body = $7,
      response_headers = $10::jsonb, steps = $8::jsonb,
      stuck = false, lease_owner = NULL, lease_expires_at = NULL,
      completed_at = now(), updated_at = now(),
      -- Retention counts from the end: a saga that ran (or was stuck) long keeps its answer.
      expires_at = now() + make_interval(secs => $9)
  WHERE tenant_id = $1 AND idempotency_key = $2 AND lease_owner = $3 AND lease_epoch = $4
    AND status NOT IN ('completed', 'failed'))sql"};

}  // namespace

SagaRow detail::ToRow(const pqxx::row& row, int first) {
  auto r = [&](int i) { return row[first + i]; };
  SagaRow s;
  s.tenant_id = r(0).as<std::string>();
  s.key = r(1).as<std::string>();
  s.request_hash = r(2).as<std::string>();
  s.request_body = nlohmann::json::parse(r(3).as<std::string>());
  s.saga_name = r(4).as<std::string>();
  s.order_id = r(5).as<std::string>();
  auto status = ParseSagaStatus(r(6).as<std::string>());
  if (!status) throw std::runtime_error("unknown saga status " + r(6).as<std::string>());
  s.status = *status;
  s.lease_owner = r(7).as<std::string>();
  s.lease_epoch = r(8).as<long long>();
  s.lease_live = r(9).as<bool>();
  s.lease_seconds_left = r(10).as<double>();
  auto read = ReadSteps(nlohmann::json::parse(r(11).as<std::string>()));
  s.steps = std::move(read.steps);
  s.unreadable_steps = std::move(read.unreadable);
  s.failed_step = r(12).as<std::string>();
  if (auto failure = nlohmann::json::parse(r(13).as<std::string>()); !failure.is_null()) {
    try {
      s.failure = steps::saga::FailureFromJson(failure);
    } catch (const nlohmann::json::exception& e) {
      // A damaged column must not make every read of the row throw (a listing, a take-over
      // batch): the row stays readable and is set aside when something tries to resume it.
      s.unreadable_failure = std::string("the stored failure cannot be read: ") + e.what();
    }
  }
  s.stuck = r(14).as<bool>();
  s.response_status = r(15).as<int>();
  s.response_headers = nlohmann::json::parse(r(16).as<std::string>());
  s.response_body = r(17).as<std::string>();
  s.trace_id = r(18).as<std::string>();
  s.created_at = r(19).as<std::string>();
  s.updated_at = r(20).as<std::string>();
  s.root_span_id = r(21).as<std::string>();
  s.expires_in_seconds = r(22).as<double>();
  s.saga_version = r(23).as<int>();
  s.cancel_requested = nlohmann::json::parse(r(24).as<std::string>());
  s.resolution = nlohmann::json::parse(r(25).as<std::string>());
  auto waiting = nlohmann::json::parse(r(26).as<std::string>());
  if (waiting.is_array()) {
    for (const auto& e : waiting) s.waiting_for.push_back(e.get<std::string>());
  }
  return s;
}

ReadRecords ReadSteps(const nlohmann::json& column) {
  ReadRecords read;
  for (const auto& json : column) {
    try {
      read.steps.push_back(steps::saga::StepRecord::FromJson(json));
    } catch (const std::exception& e) {  // std::invalid_argument, nlohmann::json::exception
      read.unreadable[read.steps.size()] = {json, e.what()};
      read.steps.emplace_back();
    }
  }
  return read;
}

nlohmann::json StepsColumn(const SagaRow& row) {
  nlohmann::json column = nlohmann::json::array();
  for (size_t i = 0; i < row.steps.size(); ++i) {
    auto unreadable = row.unreadable_steps.find(i);
    column.push_back(unreadable != row.unreadable_steps.end() ? unreadable->second.stored
                                                              : row.steps[i].ToJson());
  }
  return column;
}

// Names of [a-z0-9_] only (event names): nothing in them needs quoting in an array literal.
std::string TextArray(const std::vector<std::string>& names) {
  return "{" + common::Join(names, ",") + "}";
}

namespace {

// The row a claim just inserted: the request, and what the database chose.
SagaRow ClaimedRow(const ClaimRequest& req, const pqxx::row& r) {
  SagaRow s;
  s.tenant_id = req.tenant_id;
  s.key = req.key;
  s.request_hash = req.request_hash;
  s.request_body = req.request_body;
  s.saga_name = req.saga_name;
  s.saga_version = req.saga_version;
  s.order_id = r[0].as<std::string>();
  s.status = SagaStatus::kStarted;
  s.lease_owner = req.owner;
  s.lease_epoch = r[1].as<long long>();
  s.lease_live = true;
  s.created_at = r[2].as<std::string>();
  s.updated_at = r[3].as<std::string>();
  s.lease_seconds_left = r[4].as<double>();
  s.expires_in_seconds = r[5].as<double>();
  s.trace_id = req.trace_id;
  s.root_span_id = req.root_span_id;
  return s;
}

}  // namespace

Claim ParentStore::ClaimKey(const ClaimRequest& req) {
  // Phase 1: claim, or read what is there. Each statement's connection goes back to the pool
  // before the next borrows one: nested borrows could exhaust the pool under a retry storm.
  // A key found taken but gone by the time it is read (garbage collection) is claimed again.
  std::optional<std::pair<bool, SagaRow>> outcome;
  for (int attempt = 0; !outcome; ++attempt) {
    // Our own outage (common/failure.hpp), not a library's exception made up: the request is
    // answered 503 + Retry-After, and nothing was claimed for it.
    if (attempt == 3)
      throw common::Unavailable("idempotency key claim kept racing concurrent claims");
    auto claimed = OneStatement([&](pqxx::nontransaction& tx) -> std::optional<SagaRow> {
      auto rows = Exec(
          tx, kClaim, req.tenant_id, req.key, req.request_hash, req.request_body.dump(),
          req.saga_name, req.owner, Seconds(options_.lease), req.trace_id,
          Seconds(std::chrono::duration_cast<std::chrono::seconds>(options_.retention)),
          req.root_span_id.empty() ? std::nullopt : std::optional<std::string>(req.root_span_id),
          req.saga_version);
      if (rows.empty()) return std::nullopt;
      return ClaimedRow(req, rows[0]);
    });
    if (claimed) {
      outcome.emplace(true, std::move(*claimed));
      break;
    }
    OnClaimConflict();
    if (auto found = Get(req.tenant_id, req.key)) outcome.emplace(false, std::move(*found));
  }
  auto [claimed, row] = *outcome;
  if (claimed) {
    return Claim{Claim::kClaimed, row, {req.tenant_id, req.key, req.owner, row.lease_epoch}};
  }
  if (!req.Matches(row.request_hash)) return Claim{Claim::kMismatch, row, {}};
  if (Finished(row.status)) return Claim{Claim::kFinished, row, {}};
  if (row.lease_live) return Claim{Claim::kInProgress, row, {}};
  // Phase 2: the owner died (or stalled past its lease): resume it here, unless another
  // process beats us to it; then answer from what that one left.
  if (auto taken = TakeOverExpired(req.tenant_id, req.key, req.owner)) return *taken;
  auto now = Get(req.tenant_id, req.key);
  if (now && Finished(now->status)) {
    return Claim{Claim::kFinished, *now, {}};
  }
  return Claim{Claim::kInProgress, now.value_or(row), {}};
}

std::optional<Claim> ParentStore::TakeOverExpired(const std::string& tenant_id,
                                                  const std::string& key,
                                                  const std::string& owner) {
  return OneStatement([&](pqxx::nontransaction& tx) -> std::optional<Claim> {
    auto rows = Exec(tx, kTakeOver, tenant_id, key, owner, Seconds(options_.lease));
    if (rows.empty()) return std::nullopt;
    SagaRow row = ToRow(rows[0]);
    common::Log("lease_taken_over", {{"tenant", tenant_id},
                                     {"key", key},
                                     {"owner", owner},
                                     {"epoch", std::to_string(row.lease_epoch)},
                                     {"trace_id", row.trace_id}});
    return Claim{Claim::kTakenOver, row, {tenant_id, key, owner, row.lease_epoch}};
  });
}

bool ParentStore::Fenced(const Lease& lease, const char* what, bool applied) {
  if (applied) return false;
  ++fenced_writes_;
  common::Log("fenced_write", {{"tenant", lease.tenant_id},
                               {"key", lease.key},
                               {"owner", lease.owner},
                               {"epoch", std::to_string(lease.epoch)},
                               {"write", what}});
  return true;
}

bool ParentStore::Renew(const Lease& l, bool* cancel_requested) {
  auto n = OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kRenew, l.tenant_id, l.key, l.owner, l.epoch, Seconds(options_.lease));
    if (cancel_requested != nullptr && !r.empty()) *cancel_requested = r[0][0].as<bool>();
    return r.affected_rows();
  });
  return !Fenced(l, "renew", n == 1);
}

bool ParentStore::BeginCompensation(const Lease& l, const nlohmann::json& steps,
                                    const std::string& failed_step, const nlohmann::json& failure) {
  auto n = OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kBeginCompensation, l.tenant_id, l.key, l.owner, l.epoch, steps.dump(),
                  failed_step, failure.dump());
    return r.affected_rows();
  });
  return !Fenced(l, "begin_compensation", n == 1);
}

bool ParentStore::DeferStuck(const Lease& l, const nlohmann::json& steps,
                             std::chrono::milliseconds retry_in) {
  return SetAside(l, steps, retry_in, true, {}, "defer_stuck");
}

bool ParentStore::Park(const Lease& l, const nlohmann::json& steps,
                       std::chrono::milliseconds wake_in) {
  return SetAside(l, steps, wake_in, false, {}, "park");
}

ParentStore::AwaitOutcome ParentStore::ParkForEvents(const Lease& l, const nlohmann::json& steps,
                                                     const std::vector<std::string>& events,
                                                     std::chrono::milliseconds wake_in) {
  if (!SetAside(l, steps, wake_in, false, events, "park_for_events")) {
    return AwaitOutcome::kFenced;
  }
  // Two statements, each committed before the next begins: see kTakeBackForEvent.
  auto n = OneStatement([&](pqxx::nontransaction& tx) {
    return Exec(tx, kTakeBackForEvent, l.tenant_id, l.key, l.owner, l.epoch, TextArray(events),
                Seconds(options_.lease))
        .affected_rows();
  });
  return n == 1 ? AwaitOutcome::kArrived : AwaitOutcome::kParked;
}

bool ParentStore::SetAside(const Lease& l, const nlohmann::json& steps,
                           std::chrono::milliseconds until, bool stuck,
                           const std::vector<std::string>& waiting_for, const char* what) {
  auto n = OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kSetAside, l.tenant_id, l.key, l.owner, l.epoch, steps.dump(),
                  static_cast<double>(until.count()) / 1000.0, stuck, TextArray(waiting_for));
    return r.affected_rows();
  });
  return !Fenced(l, what, n == 1);
}

std::vector<Claim> ParentStore::TakeOverExpiredBatch(const std::string& owner, int limit) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto rows = Exec(tx, kTakeOverBatch, owner, Seconds(options_.lease), limit);
    std::vector<Claim> claims;
    for (const auto& r : rows) {
      SagaRow row = ToRow(r);
      common::Log("lease_taken_over", {{"tenant", row.tenant_id},
                                       {"key", row.key},
                                       {"owner", owner},
                                       {"epoch", std::to_string(row.lease_epoch)},
                                       {"status", ToString(row.status)},
                                       {"trace_id", row.trace_id}});
      claims.push_back(
          Claim{Claim::kTakenOver, row, {row.tenant_id, row.key, owner, row.lease_epoch}});
    }
    return claims;
  });
}

long long ParentStore::ReleaseLeases(const std::string& owner) {
  return OneStatement([&](pqxx::nontransaction& tx) {
    auto r = Exec(tx, kReleaseLeases, owner);
    return static_cast<long long>(r.affected_rows());
  });
}

bool ParentStore::Finish(const Lease& l, bool completed, int response_status,
                         const std::string& response_body, const nlohmann::json& steps,
                         const std::map<std::string, std::string>& response_headers) {
  auto run = [&](const std::string& spans) {
    return OneStatement([&](pqxx::nontransaction& tx) {
      auto r = Exec(tx, kFinish, l.tenant_id, l.key, l.owner, l.epoch,
                    std::string(ToString(completed ? SagaStatus::kCompleted : SagaStatus::kFailed)),
                    response_status, response_body, steps.dump(),
                    Seconds(std::chrono::duration_cast<std::chrono::seconds>(options_.retention)),
                    nlohmann::json(response_headers).dump(), spans);
      return r.affected_rows();
    });
  };
  if (rides_ == nullptr) return !Fenced(l, "finish", run("{}") == 1);
  SpanRides::Load load = rides_->Take();
  size_t n = 0;
  try {
    n = run(load.doc);
  } catch (const pqxx::sql_error&) {
    // Refused by the server: nothing of it was committed. The saga's finish must not fail
    // for its passengers, so it runs again alone, and their owners write them.
    if (load.parts.empty()) throw;
    rides_->Done(load, false);
    return !Fenced(l, "finish", run("{}") == 1);
  } catch (...) {
    rides_->Done(load, false);
    throw;
  }
  rides_->Done(load, true);
  return !Fenced(l, "finish", n == 1);
}

std::optional<SagaRow> ParentStore::Get(const std::string& tenant_id, const std::string& key) {
  return OneStatement([&](pqxx::nontransaction& tx) -> std::optional<SagaRow> {
    auto rows = Exec(tx, kGet, tenant_id, key);
    if (rows.empty()) return std::nullopt;
    return ToRow(rows[0]);
  });
}

}  // namespace idemsaga::orchestrator::store
