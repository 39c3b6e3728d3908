#include "demo/redis_inventory.hpp"

#include <algorithm>
#include <map>

#include "common/crypto.hpp"
#include "demo/stack.hpp"
#include "steps/order_schema.hpp"

namespace idemsaga::demo {
namespace {

using steps::guard::RedisGuard;
using steps::guard::Request;
using steps::guard::Response;
using steps::protocol::Outcome;
using steps::protocol::Refusal;

// The demo stock, as sql/inventory/V001__stock_and_reservations.sql seeds it.
const std::vector<std::pair<std::string, long long>> kSeedStock = {{"widget", 1000000},
                                                                   {"gadget", 10}};

// KEYS: record, reservation, index, then inv:stock:<sku> per SKU (in SKU order).
// ARGV: fingerprint, retention ms, key, reservation id, 201 body, items JSON, the 409
// problem's text before and after its detail, its content type, then SKU and quantity per SKU.
constexpr std::string_view kReserveBody = R"lua(
local retention = tonumber(ARGV[2])
local rec = load(KEYS[1])
if rec[1] then
  keep_alive(KEYS[2], retention)
  return existing(KEYS[1], rec, ARGV[1], retention)
end
local now = now_ms()
local skus = #KEYS - 3
for i = 1, skus do
  local sku, want = ARGV[8 + 2 * i], ARGV[9 + 2 * i]
  local available = redis.call('HGET', KEYS[3 + i], 'available')
  local why
  if not available then
    why = "unknown SKU '" .. sku .. "'"
  elseif tonumber(available) < tonumber(want) then
    why = 'only ' .. available .. " of '" .. sku .. "' available, " .. want .. ' wanted'
  end
  if why then  -- a business refusal: stored and replayed, nothing taken
    local body = ARGV[7] .. why .. ARGV[8]
    store(KEYS[1], ARGV[1], '409', ARGV[9], body, now, retention)
    index(KEYS[3], ARGV[3], now, retention)
    return {'applied', '409', ARGV[9], body}
  end
end
for i = 1, skus do
  local want = tonumber(ARGV[9 + 2 * i])
  redis.call('HINCRBY', KEYS[3 + i], 'available', -want)
  redis.call('HINCRBY', KEYS[3 + i], 'reserved', want)
end
redis.call('HSET', KEYS[2], 'reservation_id', ARGV[4], 'items', ARGV[6], 'status', 'reserved')
redis.call('PEXPIRE', KEYS[2], retention)
store(KEYS[1], ARGV[1], '201', 'application/json', ARGV[5], now, retention)
index(KEYS[3], ARGV[3], now, retention)
return {'applied', '201', 'application/json', ARGV[5]}
)lua";

// KEYS: the compensation's record, the action's record, the action's reservation, index,
// then inv:stock:<sku> per SKU of the reservation as read before the script.
// ARGV: fingerprint, retention ms, own key, action key, action_applied ('1'/'0'), the
// reservation's items as read before, the tombstone's body, its content type, the answers
// cancelled, already_undone, nothing_to_undo, undone without a reservation, and undone's text
// before and after the reservation id, then the quantity per SKU.
constexpr std::string_view kReleaseBody = R"lua(
local retention = tonumber(ARGV[2])
local own = load(KEYS[1])
if own[1] then return existing(KEYS[1], own, ARGV[1], retention) end
local now = now_ms()
keep_alive(KEYS[2], retention)
keep_alive(KEYS[3], retention)
local action = redis.call('HMGET', KEYS[2], 'status', 'rs', 'comp')
local outcome, body
if not action[1] then
  local refused = tombstone(KEYS[2], KEYS[4], ARGV[4], ARGV[5], ARGV[7], ARGV[8], now, retention)
  if refused then return refused end
  outcome, body = 'cancelled', ARGV[9]
elseif action[1] == 'tombstone' then
  outcome, body = 'cancelled', ARGV[9]
elseif action[3] == '1' then
  outcome, body = 'already_undone', ARGV[10]
elseif tonumber(action[2]) < 200 or tonumber(action[2]) > 299 then
  outcome, body = 'nothing_to_undo', ARGV[11]
else
  local res = redis.call('HMGET', KEYS[3], 'status', 'reservation_id', 'items')
  if res[1] == 'reserved' then
    -- The stock keys were named from what was read before the script: still the same?
    if res[3] ~= ARGV[6] then return {'retry'} end
    for i = 1, #KEYS - 4 do
      local n = tonumber(ARGV[14 + i])
      redis.call('HINCRBY', KEYS[4 + i], 'available', n)
      redis.call('HINCRBY', KEYS[4 + i], 'reserved', -n)
    end
    redis.call('HSET', KEYS[3], 'status', 'released')
    body = ARGV[13] .. res[2] .. ARGV[14]
  else
    body = ARGV[12]
  end
  -- The undone action is kept a full retention from now: a late retry of its key must keep
  -- hearing "compensated", never find the key free again.
  redis.call('HSET', KEYS[2], 'comp', '1')
  redis.call('PEXPIRE', KEYS[2], retention)
  if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], retention) end
  index(KEYS[4], ARGV[4], now, retention)
  outcome = 'undone'
end
store(KEYS[1], ARGV[1], '200', 'application/json', body, now, retention)
index(KEYS[4], ARGV[3], now, retention)
return {outcome, '200', 'application/json', body}
)lua";

// Written over the guard's Lua: its record (load, existing, store) and its index.
const common::redis::Script kReserve{std::string(RedisGuard::kLuaPrelude) +
                                     std::string(kReserveBody)};
const common::redis::Script kRelease{std::string(RedisGuard::kLuaPrelude) +
                                     std::string(kReleaseBody)};

// A JSON text split around the string value "\x01": the parts a script joins around a value
// it computes (one that needs no JSON escaping: digits, [a-z0-9_-], quotes of SKUs).
std::pair<std::string, std::string> Around(const std::string& dumped) {
  constexpr std::string_view kHole = "\\u0001";
  auto at = dumped.find(kHole);
  return {dumped.substr(0, at), dumped.substr(at + kHole.size())};
}

std::string Text(const common::redis::Reply& r, size_t i) {
  return i < r.elements.size() ? r.elements[i].str : std::string();
}

// Quantities per SKU, in SKU order (the order the script names the stock keys in).
std::map<std::string, long long> BySku(const nlohmann::json& items) {
  std::map<std::string, long long> out;
  for (const auto& item : items) {
    out[item["sku"].get<std::string>()] += item["quantity"].get<long long>();
  }
  return out;
}

}  // namespace

std::string RedisInventory::StockKey(const std::string& sku) { return "inv:stock:" + sku; }
std::string RedisInventory::ReservationKey(const std::string& tenant_id, const std::string& key) {
  return "inv:res:" + tenant_id + ":" + key;
}
RedisInventory::RedisInventory(common::redis::Pool& redis, std::chrono::seconds retention)
    : redis_(redis), retention_(retention), guard_(redis, {.retention = retention}) {}

void RedisInventory::Seed() {
  for (const auto& [sku, units] : kSeedStock) {
    redis_.Command({"HSETNX", StockKey(sku), "available", std::to_string(units)});
    redis_.Command({"HSETNX", StockKey(sku), "reserved", "0"});
  }
}

Response RedisInventory::Reserve(const Request& req) {
  const auto wanted = BySku(req.body["items"]);
  nlohmann::json items = nlohmann::json::array();
  for (const auto& [sku, quantity] : wanted) {
    items.push_back({{"sku", sku}, {"quantity", quantity}});
  }
  // Drawn here, used only if this request applies: like PostgreSQL's 'res_' || a UUID's hex.
  const std::string id = "res_" + common::RandomHex(16);
  const nlohmann::json body = {{"reservation_id", id}, {"items", items}};
  const auto [before, after] = Around(common::http::ProblemBody(409, kInsufficientStock, "\x01"));
  std::vector<std::string> keys = {RedisGuard::RecordKey(req.tenant_id, req.key),
                                   ReservationKey(req.tenant_id, req.key),
                                   RedisGuard::IndexKey(req.tenant_id)};
  std::vector<std::string> args = {steps::guard::Fingerprint(req),
                                   std::to_string(retention_.count() * 1000),
                                   req.key,
                                   id,
                                   body.dump(),
                                   items.dump(),
                                   before,
                                   after,
                                   common::http::kProblemContentType};
  for (const auto& [sku, quantity] : wanted) {
    keys.push_back(StockKey(sku));
    args.push_back(sku);
    args.push_back(std::to_string(quantity));
  }
  return RedisGuard::AnswerOf(redis_.Eval(kReserve, keys, args));
}

Response RedisInventory::Release(const Request& req, const std::string& action_key,
                                 bool action_applied) {
  auto undone = [&](Outcome outcome, const nlohmann::json& detail) {
    return steps::protocol::CompensationBody(action_key, outcome, detail);
  };
  const auto [id_before, id_after] =
      Around(undone(Outcome::kUndone, {{"released", true}, {"reservation_id", "\x01"}}));
  // The stock keys a release touches are the reservation's SKUs: read them first, so the
  // script names every key it writes; it refuses ("retry") if they changed meanwhile.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto items_text =
        redis_.Command({"HGET", ReservationKey(req.tenant_id, action_key), "items"}).str;
    std::map<std::string, long long> items;
    if (!items_text.empty()) items = BySku(nlohmann::json::parse(items_text));
    std::vector<std::string> keys = {RedisGuard::RecordKey(req.tenant_id, req.key),
                                     RedisGuard::RecordKey(req.tenant_id, action_key),
                                     ReservationKey(req.tenant_id, action_key),
                                     RedisGuard::IndexKey(req.tenant_id)};
    std::vector<std::string> args = {steps::guard::Fingerprint(req),
                                     std::to_string(retention_.count() * 1000),
                                     req.key,
                                     action_key,
                                     action_applied ? "1" : "0",
                                     items_text,
                                     steps::guard::Refuse(Refusal::kTombstone).body,
                                     common::http::kProblemContentType,
                                     undone(Outcome::kCancelled, nullptr),
                                     undone(Outcome::kAlreadyUndone, nullptr),
                                     undone(Outcome::kNothingToUndo, nullptr),
                                     undone(Outcome::kUndone, {{"released", false}}),
                                     id_before,
                                     id_after};
    for (const auto& [sku, quantity] : items) {
      keys.push_back(StockKey(sku));
      args.push_back(std::to_string(quantity));
    }
    auto reply = redis_.Eval(kRelease, keys, args);
    if (Text(reply, 0) != "retry") return RedisGuard::AnswerOf(reply);
  }
  throw common::redis::Error("the reservation changed under its release three times");
}

std::optional<StockLevel> RedisInventory::Stock(const std::string& sku) {
  auto reply = redis_.Command({"HMGET", StockKey(sku), "available", "reserved"});
  if (reply.elements.size() != 2 || reply.elements[0].type != common::redis::Reply::Type::kString) {
    return std::nullopt;
  }
  return StockLevel{std::stoll(reply.elements[0].str), std::stoll(reply.elements[1].str)};
}

void RegisterRedisInventoryRoutes(common::http::Server& server, GuardedRoutes& routes,
                                  RedisInventory& inventory) {
  routes.GuardedAction(server, "/v1/reservations", steps::ValidateReservation,
                       [&inventory](const Request& req) { return inventory.Reserve(req); });
  routes.GuardedCompensation(
      server, "/v1/reservations/release",
      [&inventory](const Request& req, const std::string& action_key, bool applied) {
        return inventory.Release(req, action_key, applied);
      });
  server.Get(R"(/v1/stock/([a-z0-9_-]{1,64}))",
             [&routes, &inventory](const httplib::Request& req, httplib::Response& res) {
               if (!routes.Authorized(req, res)) return;
               std::string sku = common::http::DecodeCapture(req.matches[1].str());
               std::optional<StockLevel> level;
               try {
                 level = inventory.Stock(sku);
               } catch (const std::exception&) {
                 return common::http::SetUnavailable(res, "the stock could not be read");
               }
               if (!level) {
                 common::http::SetError(res, 404, "not_found", "unknown SKU '" + sku + "'");
                 return;
               }
               nlohmann::json body = {
                   {"sku", sku}, {"available", level->available}, {"reserved", level->reserved}};
               res.set_content(body.dump(), "application/json");
             });
}

}  // namespace idemsaga::demo
