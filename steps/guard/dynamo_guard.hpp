// The participant guard's key store on DynamoDB: the promise of Guard::RunExternal and
// Guard::CompensateExternal (guard.hpp) kept in a DynamoDB table, for a participant whose
// effect is elsewhere (a partner's API, a card network) and whose state is in DynamoDB.
//
// The same protocol as the PostgreSQL and Redis stores, out of single-item conditional writes
// (docs/dynamodb.md): a key is claimed as pending under a lease and a fencing token by a PutItem
// under attribute_not_exists, the call goes out with nothing held, and an UpdateItem records
// the answer only under the caller's token. Whenever a condition fails the item is read with
// ConsistentRead and answered from: a retry replays the stored answer byte for byte (headers
// too), the same key with another body is refused 422, a duplicate in flight 409 +
// Retry-After, and a claim whose lease ran out is taken over under the next token and its
// effect told earlier_attempt. A compensation claims its own key first, then undoes its
// action once or, arriving first, leaves a tombstone that refuses the late action. Every
// answer is worded by Refuse and the protocol's tables, as on the other stores.
//
// Table (one per participant, EnsureTable): partition key tenant_id, sort key idem_key, both
// strings; an item {key_status, request_hash, answer_status, answer_type, answer_body,
// answer_headers, is_compensated, written_at, indexed_at, lease_until, fencing_token,
// expires_ms, expires_at}. Times are the writer's clock in epoch ms; expires_at (epoch s) is
// the table's TTL attribute. TTL deletes lazily (and emulators not at all), so every read
// treats an item past expires_ms as absent and every claim may overwrite it; DeleteExpired
// scans for such items and deletes them. A key expires GuardOptions::retention after its
// claim (a compensation restarts an action's clock; a key read past half its life is kept a
// full retention again).
//
// Thread-safe.
//   common::dynamo::Client dynamo(common::dynamo::Client::FromEnvironment(url));
//   steps::guard::DynamoGuard g(dynamo, "idempotency_keys", {.retention =
//   std::chrono::hours(168)}); g.EnsureTable(); auto res = g.RunExternal(req, [&](const
//   ExternalCall& call) { return SendEmail(call); });
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/dynamo/client.hpp"
#include "steps/guard/guard.hpp"

namespace idemsaga::steps::guard {

class DynamoGuard : public KeyStore {
 public:
  // Uses `options.lease` and `options.retention` (Duplicates does not apply: a conditional
  // write never waits, so a duplicate in flight always gets 409 at once).
  DynamoGuard(common::dynamo::Client& dynamo, std::string table, GuardOptions options);

  // Creates the table when it is missing (on-demand capacity) and waits until it is ACTIVE;
  // turns TTL on for expires_at where the endpoint supports it. Throws
  // common::dynamo::Unavailable when DynamoDB cannot be reached, common::dynamo::Error when it
  // refuses (credentials, a table of another shape).
  void EnsureTable();
  // True when the table can be described.
  bool Ready() override;

  // As Guard::RunExternal and Guard::CompensateExternal (guard.hpp); an outage throws
  // common::dynamo::Unavailable (every write is one item, atomic: retry with the key).
  Response RunExternal(const Request& req, const ExternalEffect& effect) override;
  Response CompensateExternal(const Request& req, const std::string& action_key,
                              const ExternalUndo& undo, bool action_applied = false) override;

  // As Guard::ListKeys: one strongly consistent Query of the tenant's partition, in key order.
  std::vector<protocol::KeyRecord> ListKeys(const std::string& tenant_id,
                                            std::chrono::seconds since, const std::string& after,
                                            int limit) override;
  // Scans for up to `batch` items past their expiry and deletes each under the condition that
  // it is still expired (a key claimed again meanwhile stays).
  long long DeleteExpired(int batch) override;

  const GuardOptions& options() const override { return options_; }

 private:
  struct Claimed;
  struct Found;
  Claimed Claim(const Request& req, const std::string& hash);
  // Writes a key's first item unless a live one is there; false when one is.
  bool PutFirst(const nlohmann::json& item, long long now);
  std::optional<long long> TakeOver(const Request& req, const nlohmann::json& item, long long now);
  Found FindAction(const Request& req, const std::string& action_key, bool action_applied);
  Response Existing(const Request& req, const nlohmann::json& item, const std::string& hash,
                    long long now);
  void KeepAlive(const std::string& tenant_id, const nlohmann::json& item, long long now);
  // The item under (tenant, key) when it exists and has not expired.
  std::optional<nlohmann::json> Load(const std::string& tenant_id, const std::string& key);
  Response Record(const Request& req, long long token, const Response& res,
                  const std::string& action_key);
  // Gives a claim back without an answer: a fresh one is deleted, a taken-over one released.
  void Unclaim(const Request& req, const Claimed& claimed);
  nlohmann::json Key(const std::string& tenant_id, const std::string& key) const;
  common::dynamo::Client::Result Call(const std::string& operation, nlohmann::json request);

  common::dynamo::Client& dynamo_;
  std::string table_;
  GuardOptions options_;
};

}  // namespace idemsaga::steps::guard
