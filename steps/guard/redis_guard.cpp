// RedisGuard: the external modes of the guard (claim, call out, record under a fencing token;
// compensation and tombstones) over Redis scripts that decide and return names, worded here
// from participant_protocol.hpp's tables.
#include "steps/guard/redis_guard.hpp"

#include <algorithm>

#include "common/http/problem.hpp"
#include "common/log.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using common::redis::Reply;
using common::redis::Script;

const std::string_view RedisGuard::kLuaPrelude = R"lua(#!lua
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A key still in use (a stuck saga retries for as long as it takes) is kept a full retention
-- from now once past half its life, so ordinary replays stay cheap.
local function keep_alive(key, retention_ms)
  local ttl = redis.call('PTTL', key)
  if ttl >= 0 and ttl < retention_ms / 2 then redis.call('PEXPIRE', key, retention_ms) end
end
-- The reconciler's index of a tenant's keys by write time; entries past the retention go.
local function index(idx, key, now, retention_ms)
  redis.call('ZADD', idx, now, key)
  redis.call('ZREMRANGEBYSCORE', idx, '-inf', '(' .. (now - retention_ms))
  redis.call('PEXPIRE', idx, retention_ms)
end
local function load(key)
  return redis.call('HMGET', key, 'status', 'hash', 'rs', 'ct', 'body', 'comp', 'hd', 'lease',
                    'tok')
end
local function store(key, hash, status, ctype, body, now, retention_ms)
  redis.call('HSET', key, 'status', 'completed', 'hash', hash, 'rs', status, 'ct', ctype,
             'body', body, 'comp', '0', 't', now)
  redis.call('PEXPIRE', key, retention_ms)
end
-- What an earlier request left under the key, in the order the PostgreSQL guard's Existing()
-- decides it.
local function existing(key, rec, hash, retention_ms)
  keep_alive(key, retention_ms)
  if rec[1] == 'tombstone' then return {'cancelled', rec[3], rec[4], rec[5], rec[7] or '{}'} end
  if rec[2] ~= hash then return {'refused', 'key_reused'} end
  if rec[1] == 'pending' then return {'refused', 'key_pending'} end
  if rec[6] == '1' then return {'refused', 'compensated'} end
  return {'replayed', rec[3], rec[4], rec[5], rec[7] or '{}'}
end
-- A compensation that finds no record of its action (under `key`): when the caller saw the
-- action succeed, {'refused', 'action_unknown'} and nothing stored (nothing can be undone, and
-- a tombstone would make that final); otherwise a tombstone, which refuses the late action.
local function tombstone(key, idx, action_key, applied, body, ctype, now, retention_ms)
  if applied == '1' then return {'refused', 'action_unknown'} end
  redis.call('HSET', key, 'status', 'tombstone', 'hash', '', 'rs', '409', 'ct', ctype,
             'body', body, 'hd', '{}', 'comp', '0', 't', now)
  redis.call('PEXPIRE', key, retention_ms)
  index(idx, action_key, now, retention_ms)
end
-- Claims `key` as pending under a lease: the first claim, token 1.
local function claim_pending(key, hash, now, lease_ms, retention_ms)
  redis.call('HSET', key, 'status', 'pending', 'hash', hash, 'rs', '0', 'ct', '', 'body', '',
             'hd', '{}', 'comp', '0', 't', now, 'lease', now + lease_ms, 'tok', 1)
  redis.call('PEXPIRE', key, retention_ms)
end
-- A pending claim whose lease ran out, taken over under the next token.
local function take_over(key, now, lease_ms)
  local token = redis.call('HINCRBY', key, 'tok', 1)
  redis.call('HSET', key, 'lease', now + lease_ms)
  return token
end
local function expired_claim(rec, hash, now)
  return rec[1] == 'pending' and rec[2] == hash and tonumber(rec[8]) <= now
end
)lua";

namespace {

// KEYS: record, index. ARGV: fingerprint, retention ms, lease ms, key.
// {'claimed', token, earlier (0/1)}, or what existing() answers.
constexpr std::string_view kClaimBody = R"lua(
local retention, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local rec = load(KEYS[1])
if not rec[1] then
  claim_pending(KEYS[1], ARGV[1], now, lease, retention)
  index(KEYS[2], ARGV[4], now, retention)
  return {'claimed', 1, 0}
end
if expired_claim(rec, ARGV[1], now) then
  keep_alive(KEYS[1], retention)
  return {'claimed', take_over(KEYS[1], now, lease), 1}
end
return existing(KEYS[1], rec, ARGV[1], retention)
)lua";

// KEYS: the compensation's record, index, the action's record. ARGV: fingerprint, retention
// ms, lease ms, own key, action key, action_applied (1/0), the tombstone's body, the cut-off
// body, the problem content type. Every check comes before the first write.
// {'claimed', token, earlier, found ('undo' | a compensation's outcome), action status, action
// body}, a refusal (nothing written), or what existing() answers.
constexpr std::string_view kClaimCompensationBody = R"lua(
local retention, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local own = load(KEYS[1])
local earlier = 0
if own[1] then
  if not expired_claim(own, ARGV[1], now) then return existing(KEYS[1], own, ARGV[1], retention) end
  earlier = 1
end
keep_alive(KEYS[3], retention)
local act = redis.call('HMGET', KEYS[3], 'status', 'rs', 'body', 'comp', 'lease')
local found, status, body = 'undo', '0', ''
if not act[1] then
  local refused = tombstone(KEYS[3], KEYS[2], ARGV[5], ARGV[6], ARGV[7], ARGV[9], now, retention)
  if refused then return refused end
  found = 'cancelled'
elseif act[1] == 'tombstone' then
  found = 'cancelled'
elseif act[1] == 'pending' then
  -- Never undo half a call: an action under a live lease is still out. One whose lease ran
  -- out is cut off (refused from now on, its holder's late answer fenced) and undone blind.
  if tonumber(act[5]) > now then return {'refused', 'action_pending'} end
  redis.call('HSET', KEYS[3], 'status', 'completed', 'rs', '409', 'ct', ARGV[9], 'body', ARGV[8],
             'hd', '{}', 'comp', '1', 'lease', 0)
  redis.call('HINCRBY', KEYS[3], 'tok', 1)
  redis.call('PEXPIRE', KEYS[3], retention)
  index(KEYS[2], ARGV[5], now, retention)
elseif act[4] == '1' then
  found = 'already_undone'
elseif tonumber(act[2]) < 200 or tonumber(act[2]) > 299 then
  found = 'nothing_to_undo'
else
  status, body = act[2], act[3]
end
local token = 1
if earlier == 1 then
  token = take_over(KEYS[1], now, lease)
else
  claim_pending(KEYS[1], ARGV[1], now, lease, retention)
  index(KEYS[2], ARGV[4], now, retention)
end
return {'claimed', token, earlier, found, status, body}
)lua";

// KEYS: record, index[, the action a compensation undid]. ARGV: token, status, content type,
// body, headers JSON, retention ms, fingerprint, action key. {'recorded'} (also when this
// token's answer is there already: a resent script), else {'fenced', ...what existing()
// answers} or {'fenced'}.
constexpr std::string_view kRecordBody = R"lua(
local retention = tonumber(ARGV[6])
local rec = load(KEYS[1])
if rec[9] == ARGV[1] and rec[1] == 'pending' then
  redis.call('HSET', KEYS[1], 'status', 'completed', 'rs', ARGV[2], 'ct', ARGV[3], 'body', ARGV[4],
             'hd', ARGV[5], 'lease', 0)
  -- The undone action is kept a full retention from now: a late retry of its key must keep
  -- hearing "compensated", never find the key free again.
  if #KEYS == 3 and redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('HSET', KEYS[3], 'comp', '1')
    redis.call('PEXPIRE', KEYS[3], retention)
    index(KEYS[2], ARGV[8], now_ms(), retention)
  end
  return {'recorded'}
end
if rec[9] == ARGV[1] and rec[1] == 'completed' then return {'recorded'} end
if not rec[1] then return {'fenced'} end
local answer = existing(KEYS[1], rec, ARGV[7], retention)
table.insert(answer, 1, 'fenced')
return answer
)lua";

// KEYS: record. ARGV: token. Ends the lease now: the next request takes the claim over.
constexpr std::string_view kReleaseBody = R"lua(
local rec = redis.call('HMGET', KEYS[1], 'status', 'tok')
if rec[1] == 'pending' and rec[2] == ARGV[1] then redis.call('HSET', KEYS[1], 'lease', 0) end
return {'released'}
)lua";

Script WithPrelude(std::string_view body) {
  return Script{std::string(RedisGuard::kLuaPrelude) + std::string(body)};
}
const Script kClaim = WithPrelude(kClaimBody);
const Script kClaimCompensation = WithPrelude(kClaimCompensationBody);
const Script kRecord = WithPrelude(kRecordBody);
const Script kRelease = WithPrelude(kReleaseBody);

std::string Text(const Reply& r, size_t i) {
  return i < r.elements.size() ? r.elements[i].str : std::string();
}

long long Number(const Reply& r, size_t i) {
  if (i >= r.elements.size()) throw common::redis::Error("a guard script's reply is too short");
  const auto& e = r.elements[i];
  return e.type == Reply::Type::kInteger ? e.integer : std::stoll(e.str);
}

std::string Millis(std::chrono::seconds s) { return std::to_string(s.count() * 1000); }

std::string ConfigValue(common::redis::Pool& redis, const std::string& name) {
  auto reply = redis.Command({"CONFIG", "GET", name});
  return reply.elements.size() == 2 ? reply.elements[1].str : std::string();
}

}  // namespace

// What a claim script found: this caller's token, and for a compensation, the action.
struct RedisGuard::Claim {
  long long token = 0;
  bool earlier = false;
  std::optional<protocol::Outcome> nothing;  // a compensation with nothing to undo: this outcome
  ActionRecord action;
};

std::optional<RedisFsync> ParseRedisFsync(std::string_view name) {
  if (name == "everysec") return RedisFsync::kEverysec;
  if (name == "always") return RedisFsync::kAlways;
  if (name == "unchecked") return RedisFsync::kUnchecked;
  return std::nullopt;
}

std::string RedisGuard::RecordKey(const std::string& tenant_id, const std::string& key) {
  return "idem:" + tenant_id + ":" + key;
}
std::string RedisGuard::IndexKey(const std::string& tenant_id) { return "idem-index:" + tenant_id; }

RedisGuard::RedisGuard(common::redis::Pool& redis, GuardOptions options)
    : redis_(redis), options_(options) {}

void RedisGuard::CheckServer(RedisFsync fsync) {
  if (fsync == RedisFsync::kUnchecked) return;
  const std::string fix = " (redis.conf, or CONFIG SET; --redis-fsync unchecked skips the check)";
  if (ConfigValue(redis_, "appendonly") != "yes") {
    throw std::runtime_error(
        "Redis keeps no append-only file: a restart would forget every key and replay nothing; "
        "set appendonly yes" +
        fix);
  }
  auto appendfsync = ConfigValue(redis_, "appendfsync");
  if (appendfsync != "always" && (fsync == RedisFsync::kAlways || appendfsync != "everysec")) {
    throw std::runtime_error("Redis has appendfsync " + appendfsync + "; set appendfsync " +
                             (fsync == RedisFsync::kAlways ? "always" : "everysec or always") +
                             fix);
  }
  // An evicted key is a promise silently broken (a retry applied twice, a tombstone gone).
  if (ConfigValue(redis_, "maxmemory") != "0" &&
      ConfigValue(redis_, "maxmemory-policy") != "noeviction") {
    throw std::runtime_error("Redis may evict keys (maxmemory-policy " +
                             ConfigValue(redis_, "maxmemory-policy") +
                             "); set maxmemory-policy noeviction" + fix);
  }
}

bool RedisGuard::Ready() {
  try {
    return redis_.Command({"PING"}).str == "PONG";
  } catch (const std::exception&) {
    return false;
  }
}

Response RedisGuard::AnswerOf(const Reply& reply, size_t from) {
  if (reply.type != Reply::Type::kArray || reply.elements.size() <= from) {
    throw common::redis::Error("unexpected reply from a guard script");
  }
  const std::string name = Text(reply, from);
  if (name == "refused") {
    auto refusal = protocol::ParseRefusal(Text(reply, from + 1));
    if (!refusal)
      throw common::redis::Error("a guard script refused with '" + Text(reply, from + 1) + "'");
    return Refuse(*refusal);
  }
  const auto outcome = protocol::ParseOutcome(name);
  if (!outcome || *outcome == protocol::Outcome::kNone) {
    throw common::redis::Error("a guard script answered the outcome '" + name + "'");
  }
  Response res;
  res.status = static_cast<int>(Number(reply, from + 1));
  res.content_type = Text(reply, from + 2);
  res.body = Text(reply, from + 3);
  if (auto headers = Text(reply, from + 4); !headers.empty()) {
    const auto parsed = nlohmann::json::parse(headers);  // outlives items()
    for (const auto& [header, value] : parsed.items()) {
      if (value.is_string()) res.headers[header] = value.get<std::string>();
    }
  }
  res.outcome = *outcome;
  res.replayed = *outcome == protocol::Outcome::kReplayed;
  return res;
}

Response RedisGuard::RunExternal(const Request& req, const Guard::ExternalEffect& effect) {
  auto claimed =
      redis_.Eval(kClaim, {RecordKey(req.tenant_id, req.key), IndexKey(req.tenant_id)},
                  {Fingerprint(req), Millis(options_.retention), Millis(options_.lease), req.key});
  return External(
      req, claimed, [&](const ExternalCall& call, const Claim&) { return effect(call); }, "");
}

Response RedisGuard::CompensateExternal(const Request& req, const std::string& action_key,
                                        const Guard::ExternalUndo& undo, bool action_applied) {
  auto claimed = redis_.Eval(
      kClaimCompensation,
      {RecordKey(req.tenant_id, req.key), IndexKey(req.tenant_id),
       RecordKey(req.tenant_id, action_key)},
      {Fingerprint(req), Millis(options_.retention), Millis(options_.lease), req.key, action_key,
       action_applied ? "1" : "0", Refuse(protocol::Refusal::kTombstone).body,
       Refuse(protocol::Refusal::kCutOff).body, common::http::kProblemContentType});
  return External(
      req, claimed,
      [&](const ExternalCall& call, const Claim& claim) {
        return detail::Undone(action_key, protocol::Outcome::kUndone, undo(call, claim.action));
      },
      action_key);
}

Response RedisGuard::External(
    const Request& req, const Reply& claimed,
    const std::function<Response(const ExternalCall&, const Claim&)>& call,
    const std::string& action_key) {
  if (Text(claimed, 0) != "claimed") return AnswerOf(claimed);
  Claim claim{Number(claimed, 1), Number(claimed, 2) != 0};
  if (claimed.elements.size() > 3 && Text(claimed, 3) != "undo") {
    claim.nothing = protocol::ParseOutcome(Text(claimed, 3));
    if (!claim.nothing)
      throw common::redis::Error("a guard script found '" + Text(claimed, 3) + "'");
  } else if (claimed.elements.size() > 3) {
    int status = static_cast<int>(Number(claimed, 4));
    claim.action = {action_key, status,
                    status == 0 ? nlohmann::json(nullptr)
                                : nlohmann::json::parse(Text(claimed, 5), nullptr, false)};
  }
  // Nothing to undo: answered now, stored under this caller's claim, nothing called out.
  if (claim.nothing) {
    return Record(req, claim.token, detail::Undone(action_key, *claim.nothing, nullptr), "");
  }
  return detail::CallUnderLease(
      req, claim.token, claim.earlier, options_.lease,
      [&](const ExternalCall& c) { return call(c, claim); },
      [&] {
        redis_.Eval(kRelease, {RecordKey(req.tenant_id, req.key)}, {std::to_string(claim.token)});
      },
      [&](const Response& res) { return Record(req, claim.token, res, action_key); });
}

Response RedisGuard::Record(const Request& req, long long token, const Response& res,
                            const std::string& action_key) {
  std::vector<std::string> keys = {RecordKey(req.tenant_id, req.key), IndexKey(req.tenant_id)};
  if (!action_key.empty()) keys.push_back(RecordKey(req.tenant_id, action_key));
  auto reply = redis_.Eval(
      kRecord, keys,
      {std::to_string(token), std::to_string(res.status), res.content_type, res.body,
       detail::HeadersJson(res), Millis(options_.retention), Fingerprint(req), action_key});
  if (Text(reply, 0) == "recorded") return res;
  // Taken over while this call was out (its lease ran out): a zombie's answer is not stored.
  common::Log(
      "guard_fenced",
      {{"tenant", req.tenant_id}, {"key", req.key}, {"fencing_token", std::to_string(token)}});
  Response fenced =
      reply.elements.size() > 1 ? AnswerOf(reply, 1) : Refuse(protocol::Refusal::kClaimTakenOver);
  fenced.outcome = protocol::Outcome::kFenced;
  return fenced;
}

std::vector<protocol::KeyRecord> RedisGuard::ListKeys(const std::string& tenant_id,
                                                      std::chrono::seconds since,
                                                      const std::string& after, int limit) {
  since = std::min(since, options_.retention);
  auto now_reply = redis_.Command({"TIME"});
  long long now_ms = std::stoll(now_reply.elements.at(0).str) * 1000 +
                     std::stoll(now_reply.elements.at(1).str) / 1000;
  auto members = redis_.Command({"ZRANGEBYSCORE", IndexKey(tenant_id),
                                 std::to_string(now_ms - since.count() * 1000), "+inf"});
  std::vector<std::string> keys;
  for (const auto& m : members.elements) {
    if (m.str > after) keys.push_back(m.str);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<protocol::KeyRecord> out;
  for (const auto& key : keys) {
    if (static_cast<int>(out.size()) == limit) break;
    auto rec = redis_.Command({"HMGET", RecordKey(tenant_id, key), "status", "rs", "comp", "t"});
    if (rec.elements.size() != 4 || rec.elements[0].type != Reply::Type::kString) {
      continue;  // expired since it was indexed
    }
    auto status = protocol::ParseKeyStatus(rec.elements[0].str);
    if (!status) {
      throw common::redis::Error("a key record with the status '" + rec.elements[0].str + "'");
    }
    out.push_back({key, *status, std::stoi(rec.elements[1].str), rec.elements[2].str == "1",
                   static_cast<double>(now_ms - std::stoll(rec.elements[3].str)) / 1000.0});
  }
  return out;
}

}  // namespace idemsaga::steps::guard
