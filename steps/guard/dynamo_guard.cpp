// DynamoGuard: the guard's external modes as single-item conditional writes, answered from a
// consistent read whenever a condition fails (dynamo_guard.hpp, docs/dynamodb.md).
#include "steps/guard/dynamo_guard.hpp"

#include <algorithm>
#include <thread>

#include "common/http/problem.hpp"
#include "common/log.hpp"
#include "steps/guard/guard_internal.hpp"

namespace idemsaga::steps::guard {

using nlohmann::json;

namespace {

// A key whose item vanished or changed between a failed condition and the read after it is
// claimed again; past this many attempts it is an outage (503, retry with the key).
constexpr int kAttempts = 5;

json S(const std::string& v) { return {{"S", v}}; }
json N(long long v) { return {{"N", std::to_string(v)}}; }

std::string Str(const json& item, const char* name) {
  auto it = item.find(name);
  return it != item.end() && it->contains("S") ? (*it)["S"].get<std::string>() : std::string();
}

long long Num(const json& item, const char* name) {
  auto it = item.find(name);
  return it != item.end() && it->contains("N") ? std::stoll((*it)["N"].get<std::string>()) : 0;
}

long long NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The stored answer of `item`, as `outcome`.
Response Stored(protocol::Outcome outcome, const json& item) {
  Response res;
  res.status = static_cast<int>(Num(item, "answer_status"));
  res.content_type = Str(item, "answer_type");
  res.body = Str(item, "answer_body");
  const auto headers = json::parse(Str(item, "answer_headers"), nullptr, false);
  if (headers.is_object()) {
    for (const auto& [header, value] : headers.items()) {
      if (value.is_string()) res.headers[header] = value.get<std::string>();
    }
  }
  res.outcome = outcome;
  res.replayed = outcome == protocol::Outcome::kReplayed;
  return res;
}

// The expiry attributes of a key written at `now`, for an UpdateExpression's values.
json Expiry(long long now, std::chrono::seconds retention) {
  const long long ms = now + retention.count() * 1000;
  return {{":expms", N(ms)}, {":expat", N((ms + 999) / 1000)}};
}

// A key's first item: a pending claim, or a tombstone with its answer (`res`).
json FirstItem(json key, const std::string& status, const std::string& hash, const Response& res,
               long long now, std::chrono::seconds retention) {
  const json expiry = Expiry(now, retention);
  key.update({{"key_status", S(status)},
              {"request_hash", S(hash)},
              {"answer_status", N(res.status)},
              {"answer_type", S(res.content_type)},
              {"answer_body", S(res.body)},
              {"answer_headers", S("{}")},
              {"is_compensated", N(0)},
              {"written_at", N(now)},
              {"indexed_at", N(now)},
              {"expires_ms", expiry[":expms"]},
              {"expires_at", expiry[":expat"]}});
  return key;
}

}  // namespace

// A claim of a key: this caller's (under `token`), or answered from what is stored.
struct DynamoGuard::Claimed {
  bool owned = false;
  long long token = 0;
  bool earlier = false;
  Response answer;
};

// What a compensation found of its action (kUndo, kNothing, kRefused as detail::Found).
struct DynamoGuard::Found {
  std::optional<protocol::Refusal> refusal;
  std::optional<protocol::Outcome> nothing;
  ActionRecord action;
};

DynamoGuard::DynamoGuard(common::dynamo::Client& dynamo, std::string table, GuardOptions options)
    : dynamo_(dynamo), table_(std::move(table)), options_(options) {}

json DynamoGuard::Key(const std::string& tenant_id, const std::string& key) const {
  return {{"tenant_id", S(tenant_id)}, {"idem_key", S(key)}};
}

common::dynamo::Client::Result DynamoGuard::Call(const std::string& operation, json request) {
  request["TableName"] = table_;
  return dynamo_.Call(operation, request);
}

void DynamoGuard::EnsureTable() {
  try {
    Call("CreateTable", {{"AttributeDefinitions",
                          {{{"AttributeName", "tenant_id"}, {"AttributeType", "S"}},
                           {{"AttributeName", "idem_key"}, {"AttributeType", "S"}}}},
                         {"KeySchema",
                          {{{"AttributeName", "tenant_id"}, {"KeyType", "HASH"}},
                           {{"AttributeName", "idem_key"}, {"KeyType", "RANGE"}}}},
                         {"BillingMode", "PAY_PER_REQUEST"}});
  } catch (const common::dynamo::Error& e) {
    if (e.type() != "ResourceInUseException") throw;  // it exists already
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (Call("DescribeTable", json::object()).body["Table"].value("TableStatus", "") != "ACTIVE") {
    if (std::chrono::steady_clock::now() > deadline) {
      throw common::dynamo::Unavailable("the table " + table_ + " is not ACTIVE after 60 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  try {
    Call("UpdateTimeToLive",
         {{"TimeToLiveSpecification", {{"Enabled", true}, {"AttributeName", "expires_at"}}}});
  } catch (const common::dynamo::Error& e) {
    // An emulator without TTL (the reads ignore expired items anyway), or TTL already on.
    common::Log("dynamodb_ttl_not_set", {{"table", table_}, {"error", e.what()}});
  }
}

bool DynamoGuard::Ready() {
  try {
    Call("DescribeTable", json::object());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::optional<json> DynamoGuard::Load(const std::string& tenant_id, const std::string& key) {
  auto r = Call("GetItem", {{"Key", Key(tenant_id, key)}, {"ConsistentRead", true}});
  if (!r.body.contains("Item")) return std::nullopt;
  json item = r.body["Item"];
  if (Num(item, "expires_ms") <= NowMs()) return std::nullopt;
  return item;
}

void DynamoGuard::KeepAlive(const std::string& tenant_id, const json& item, long long now) {
  const long long retention_ms = options_.retention.count() * 1000;
  const long long left = Num(item, "expires_ms") - now;
  if (left >= retention_ms / 2) return;
  json values = Expiry(now, options_.retention);
  values[":seen"] = N(Num(item, "expires_ms"));
  // A concurrent write moved it already: nothing to do.
  Call("UpdateItem", {{"Key", Key(tenant_id, Str(item, "idem_key"))},
                      {"UpdateExpression", "SET expires_ms = :expms, expires_at = :expat"},
                      {"ConditionExpression", "expires_ms = :seen"},
                      {"ExpressionAttributeValues", values}});
}

// What an earlier request left under the key, in the order the PostgreSQL guard's Existing()
// decides it.
Response DynamoGuard::Existing(const Request& req, const json& item, const std::string& hash,
                               long long now) {
  KeepAlive(req.tenant_id, item, now);
  const std::string status = Str(item, "key_status");
  if (status == "tombstone") return Stored(protocol::Outcome::kCancelled, item);
  if (Str(item, "request_hash") != hash) return Refuse(protocol::Refusal::kKeyReused);
  if (status == "pending") return Refuse(protocol::Refusal::kKeyPending);
  if (Num(item, "is_compensated") == 1) return Refuse(protocol::Refusal::kCompensated);
  return Stored(protocol::Outcome::kReplayed, item);
}

std::optional<long long> DynamoGuard::TakeOver(const Request& req, const json& item,
                                               long long now) {
  json values = Expiry(now, options_.retention);
  values[":pending"] = S("pending");
  values[":seen"] = N(Num(item, "fencing_token"));
  values[":now"] = N(now);
  values[":lease"] = N(now + options_.lease.count() * 1000);
  values[":one"] = N(1);
  auto r = Call("UpdateItem",
                {{"Key", Key(req.tenant_id, req.key)},
                 {"UpdateExpression",
                  "SET fencing_token = fencing_token + :one, lease_until = :lease, "
                  "expires_ms = :expms, expires_at = :expat"},
                 {"ConditionExpression",
                  "key_status = :pending AND fencing_token = :seen AND lease_until <= :now"},
                 {"ExpressionAttributeValues", values},
                 {"ReturnValues", "UPDATED_NEW"}});
  if (r.condition_failed) return std::nullopt;
  return Num(r.body["Attributes"], "fencing_token");
}

bool DynamoGuard::PutFirst(const json& item, long long now) {
  // An item past its expiry is absent, whether or not TTL has deleted it yet.
  return !Call("PutItem",
               {{"Item", item},
                {"ConditionExpression", "attribute_not_exists(idem_key) OR expires_ms <= :now"},
                {"ExpressionAttributeValues", {{":now", N(now)}}}})
              .condition_failed;
}

DynamoGuard::Claimed DynamoGuard::Claim(const Request& req, const std::string& hash) {
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    const long long now = NowMs();
    json item = FirstItem(Key(req.tenant_id, req.key), "pending", hash, Response{0, "", ""}, now,
                          options_.retention);
    item["lease_until"] = N(now + options_.lease.count() * 1000);
    item["fencing_token"] = N(1);
    if (PutFirst(item, now)) return {true, 1, false, {}};
    auto found = Load(req.tenant_id, req.key);
    if (!found) continue;  // gone (expired, collected) since the condition failed
    if (Str(*found, "key_status") == "pending" && Str(*found, "request_hash") == hash &&
        Num(*found, "lease_until") <= now) {
      if (auto token = TakeOver(req, *found, now)) return {true, *token, true, {}};
      continue;  // another request took it over first
    }
    return {false, 0, false, Existing(req, *found, hash, now)};
  }
  throw common::dynamo::Unavailable("the key kept changing under its claim");
}

void DynamoGuard::Unclaim(const Request& req, const Claimed& claimed) {
  json values = {{":pending", S("pending")}, {":tok", N(claimed.token)}};
  const char* condition = "key_status = :pending AND fencing_token = :tok";
  if (!claimed.earlier) {
    Call("DeleteItem", {{"Key", Key(req.tenant_id, req.key)},
                        {"ConditionExpression", condition},
                        {"ExpressionAttributeValues", values}});
    return;
  }
  values[":zero"] = N(0);
  Call("UpdateItem", {{"Key", Key(req.tenant_id, req.key)},
                      {"UpdateExpression", "SET lease_until = :zero"},
                      {"ConditionExpression", condition},
                      {"ExpressionAttributeValues", values}});
}

Response DynamoGuard::RunExternal(const Request& req, const ExternalEffect& effect) {
  auto claimed = Claim(req, Fingerprint(req));
  if (!claimed.owned) return claimed.answer;
  return detail::CallUnderLease(
      req, claimed.token, claimed.earlier, options_.lease, effect,
      [&] {
        Unclaim(req, {true, claimed.token, true, {}});
      },
      [&](const Response& res) { return Record(req, claimed.token, res, ""); });
}

DynamoGuard::Found DynamoGuard::FindAction(const Request& req, const std::string& action_key,
                                           bool action_applied) {
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    const long long now = NowMs();
    auto item = Load(req.tenant_id, action_key);
    if (!item) {
      // Nothing can be undone, and a tombstone would make that final.
      if (action_applied) return {protocol::Refusal::kActionUnknown, {}, {}};
      // A tombstone: the action, arriving late, is refused.
      const json tombstone =
          FirstItem(Key(req.tenant_id, action_key), "tombstone", "",
                    Refuse(protocol::Refusal::kTombstone), now, options_.retention);
      if (!PutFirst(tombstone, now)) continue;  // the action arrived meanwhile: look again
      return {{}, protocol::Outcome::kCancelled, {}};
    }
    KeepAlive(req.tenant_id, *item, now);
    const std::string status = Str(*item, "key_status");
    if (status == "tombstone") return {{}, protocol::Outcome::kCancelled, {}};
    if (status == "pending") {
      // Never undo half a call: an action under a live lease is still out. One whose lease ran
      // out is cut off (refused from now on, its holder's late answer fenced) and undone blind.
      if (Num(*item, "lease_until") > now) return {protocol::Refusal::kActionPending, {}, {}};
      json values = Expiry(now, options_.retention);
      values.update({{":now", N(now)},
                     {":pending", S("pending")},
                     {":completed", S("completed")},
                     {":seen", N(Num(*item, "fencing_token"))},
                     {":conflict", N(409)},
                     {":type", S(common::http::kProblemContentType)},
                     {":body", S(Refuse(protocol::Refusal::kCutOff).body)},
                     {":none", S("{}")},
                     {":one", N(1)},
                     {":zero", N(0)}});
      auto cut =
          Call("UpdateItem",
               {{"Key", Key(req.tenant_id, action_key)},
                {"UpdateExpression",
                 "SET key_status = :completed, answer_status = :conflict, answer_type = :type, "
                 "answer_body = :body, answer_headers = :none, is_compensated = :one, "
                 "lease_until = :zero, fencing_token = fencing_token + :one, indexed_at = :now, "
                 "expires_ms = :expms, expires_at = :expat"},
                {"ConditionExpression", "key_status = :pending AND fencing_token = :seen"},
                {"ExpressionAttributeValues", values}});
      if (cut.condition_failed) continue;  // its answer arrived, or it was taken over
      return {{}, {}, {action_key, 0, nullptr}};
    }
    if (Num(*item, "is_compensated") == 1) return {{}, protocol::Outcome::kAlreadyUndone, {}};
    const int answer = static_cast<int>(Num(*item, "answer_status"));
    if (answer < 200 || answer > 299) return {{}, protocol::Outcome::kNothingToUndo, {}};
    return {{}, {}, {action_key, answer, json::parse(Str(*item, "answer_body"), nullptr, false)}};
  }
  throw common::dynamo::Unavailable("the action's key kept changing under its compensation");
}

Response DynamoGuard::CompensateExternal(const Request& req, const std::string& action_key,
                                         const ExternalUndo& undo, bool action_applied) {
  // The compensation's own key first: only its holder reads and writes the action's.
  auto claimed = Claim(req, Fingerprint(req));
  if (!claimed.owned) return claimed.answer;
  Found found;
  try {
    found = FindAction(req, action_key, action_applied);
  } catch (const std::exception&) {
    try {
      Unclaim(req, claimed);
    } catch (const std::exception&) {
      // The lease runs out on its own.
    }
    throw;
  }
  if (found.refusal) {
    // Refused with nothing stored, as on the other stores.
    Unclaim(req, claimed);
    return Refuse(*found.refusal);
  }
  // Nothing to undo: answered now, stored under this caller's claim, nothing called out.
  if (found.nothing) {
    return Record(req, claimed.token, detail::Undone(action_key, *found.nothing, nullptr), "");
  }
  return detail::CallUnderLease(
      req, claimed.token, claimed.earlier, options_.lease,
      [&](const ExternalCall& call) {
        return detail::Undone(action_key, protocol::Outcome::kUndone, undo(call, found.action));
      },
      [&] {
        Unclaim(req, {true, claimed.token, true, {}});
      },
      [&](const Response& res) { return Record(req, claimed.token, res, action_key); });
}

Response DynamoGuard::Record(const Request& req, long long token, const Response& res,
                             const std::string& action_key) {
  const long long now = NowMs();
  if (!action_key.empty()) {
    // The undone action first, so that no stored "undone" ever stands beside an action that
    // would still replay as in effect; it is kept a full retention from now: a late retry of
    // its key must keep hearing "compensated", never find the key free again.
    json values = Expiry(now, options_.retention);
    values.update({{":one", N(1)}, {":now", N(now)}});
    Call("UpdateItem", {{"Key", Key(req.tenant_id, action_key)},
                        {"UpdateExpression",
                         "SET is_compensated = :one, indexed_at = :now, expires_ms = :expms, "
                         "expires_at = :expat"},
                        {"ConditionExpression", "attribute_exists(idem_key)"},
                        {"ExpressionAttributeValues", values}});
  }
  auto r = Call("UpdateItem",
                {{"Key", Key(req.tenant_id, req.key)},
                 {"UpdateExpression",
                  "SET key_status = :completed, answer_status = :status, answer_type = :type, "
                  "answer_body = :body, answer_headers = :headers, lease_until = :zero"},
                 {"ConditionExpression", "key_status = :pending AND fencing_token = :tok"},
                 {"ExpressionAttributeValues",
                  {{":completed", S("completed")},
                   {":pending", S("pending")},
                   {":status", N(res.status)},
                   {":type", S(res.content_type)},
                   {":body", S(res.body)},
                   {":headers", S(detail::HeadersJson(res))},
                   {":zero", N(0)},
                   {":tok", N(token)}}}});
  if (!r.condition_failed) return res;
  auto item = Load(req.tenant_id, req.key);
  // This token's answer is there already: a resent write whose first answer was lost.
  if (item && Num(*item, "fencing_token") == token && Str(*item, "key_status") == "completed") {
    return res;
  }
  // Taken over while this call was out (its lease ran out): a zombie's answer is not stored.
  common::Log(
      "guard_fenced",
      {{"tenant", req.tenant_id}, {"key", req.key}, {"fencing_token", std::to_string(token)}});
  Response fenced = item ? Existing(req, *item, Fingerprint(req), now)
                         : Refuse(protocol::Refusal::kClaimTakenOver);
  fenced.outcome = protocol::Outcome::kFenced;
  return fenced;
}

std::vector<protocol::KeyRecord> DynamoGuard::ListKeys(const std::string& tenant_id,
                                                       std::chrono::seconds since,
                                                       const std::string& after, int limit) {
  since = std::min(since, options_.retention);
  const long long now = NowMs();
  json query = {
      {"ConsistentRead", true},
      {"KeyConditionExpression",
       after.empty() ? "tenant_id = :tenant" : "tenant_id = :tenant AND idem_key > :after"},
      {"FilterExpression", "indexed_at >= :since AND expires_ms > :now"},
      {"ProjectionExpression", "idem_key, key_status, answer_status, is_compensated, written_at"},
      {"ExpressionAttributeValues",
       {{":tenant", S(tenant_id)}, {":since", N(now - since.count() * 1000)}, {":now", N(now)}}}};
  if (!after.empty()) query["ExpressionAttributeValues"][":after"] = S(after);
  std::vector<protocol::KeyRecord> out;
  while (static_cast<int>(out.size()) < limit) {
    auto page = Call("Query", query).body;
    for (const auto& item : page.value("Items", json::array())) {
      if (static_cast<int>(out.size()) == limit) break;
      auto status = protocol::ParseKeyStatus(Str(item, "key_status"));
      if (!status) {
        throw std::runtime_error("a key item with the status '" + Str(item, "key_status") + "'");
      }
      out.push_back({Str(item, "idem_key"), *status, static_cast<int>(Num(item, "answer_status")),
                     Num(item, "is_compensated") == 1,
                     static_cast<double>(now - Num(item, "written_at")) / 1000.0});
    }
    if (!page.contains("LastEvaluatedKey")) break;
    query["ExclusiveStartKey"] = page["LastEvaluatedKey"];
  }
  return out;
}

long long DynamoGuard::DeleteExpired(int batch) {
  const long long now = NowMs();
  json scan = {{"FilterExpression", "expires_ms <= :now"},
               {"ProjectionExpression", "tenant_id, idem_key"},
               {"ExpressionAttributeValues", {{":now", N(now)}}}};
  long long deleted = 0;
  while (deleted < batch) {
    auto page = Call("Scan", scan).body;
    for (const auto& item : page.value("Items", json::array())) {
      if (deleted == batch) break;
      auto r = Call("DeleteItem", {{"Key", Key(Str(item, "tenant_id"), Str(item, "idem_key"))},
                                   {"ConditionExpression", "expires_ms <= :now"},
                                   {"ExpressionAttributeValues", {{":now", N(now)}}}});
      if (!r.condition_failed) ++deleted;
    }
    if (!page.contains("LastEvaluatedKey")) break;
    scan["ExclusiveStartKey"] = page["LastEvaluatedKey"];
  }
  return deleted;
}

}  // namespace idemsaga::steps::guard
