// A participant service of a team's own: the routes a saga's steps call, each guarded by an
// idempotency key in the participant's own PostgreSQL database. For each request the guard
// checks the caller's service token (401), the tenant (X-Tenant-ID) and the key
// (Idempotency-Key; 400), the JSON body (400/413/415) and `validate` (400 naming the field),
// then runs the effect at most once per (tenant, key) and stores its answer: every retry gets
// it again byte for byte (`Idempotent-Replayed: true`), the same key with another body 422, a
// duplicate in flight 409 with Retry-After. A compensation undoes its action once, or, arriving
// first, refuses the late action. The service also serves GET /v1/idempotency (the key
// retention the orchestrator checks at start-up), the keys listing reconciliation reads,
// /metrics, /healthz and /readyz.
//
// An effect in the database (Action) runs inside the guard's transaction and acts only
// through `tx`: it may run, be rolled back and run again, so it must not call out. An effect
// outside the database (ExternalAction: a card network, a partner's API) runs with no
// transaction open, under a lease; it is told when an earlier attempt may have reached the
// third party. A business refusal is a Problem(4xx, code, ...) the effect returns: stored and
// replayed like a success, so such an effect must change nothing.
//
// Keys in Redis or DynamoDB instead (ParticipantServiceOptions::store, redis_url,
// dynamodb_url): for a participant whose effects are all outside a database, ExternalAction
// and ExternalCompensation keep the same promise, and the service answers the same bytes as on
// PostgreSQL for the same calls, its policy, key listing and /metrics included. Action,
// Compensation and Schema are PostgreSQL-only (their effect is SQL on the guard's
// transaction): Start refuses them on Redis and DynamoDB (std::invalid_argument naming the
// route).
//
// Add routes, then Start (or Run); Stop once. Handlers run on the server's threads.
//   idemsaga::Participant hotel({.name = "hotel", .database_url = url, .service_token = t});
//   hotel.Schema("CREATE TABLE IF NOT EXISTS bookings (...)")
//       .Action("/v1/bookings", ValidateCity, Book)
//       .Compensation("/v1/bookings/cancel", CancelBooking);
//   int port = hotel.Start("127.0.0.1", 0);
//
// Part of idemsaga's public API (CHANGELOG.md says what may change between versions).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace idemsaga {

// A guarded request, admitted and validated.
struct Request {
  std::string tenant_id;
  std::string key;      // the step's derived key, e.g. "A-hotel"
  nlohmann::json body;  // the JSON body, as validated
};

// An effect's answer: stored with the key and replayed to every retry.
struct Response {
  int status = 200;
  std::string body;                            // JSON
  std::map<std::string, std::string> headers;  // further headers (Location ...), stored too
};

// A business refusal as a problem (application/problem+json), e.g. 422 no_cars. A 503, a 429
// and a 409 idempotency_key_in_progress also carry `Retry-After: 1`, as every idemsaga service's
// do (docs/errors.md).
Response Problem(int status, const std::string& code, const std::string& detail);

// The stored answer of the action a compensation undoes. status 0 (body null): an external
// call was cut off mid-way and its outcome is unknown: undo it by its key at the third party.
struct ActionRecord {
  std::string key;
  int status = 0;
  nlohmann::json body;
};

// An effect outside the database, called with no transaction open.
struct ExternalCall {
  const Request& request;
  // An earlier attempt under this key died mid-call: the third party may have done it
  // already. Look the effect up by the key first, or pass the key on.
  bool earlier_attempt = false;
  // When the call must be over: set the third party's client timeouts by it.
  std::chrono::steady_clock::time_point deadline;
};

// "" when the body is acceptable, else a message naming the field.
using Validate = std::function<std::string(const nlohmann::json& body)>;
using Effect = std::function<Response(pqxx::work& tx, const Request& request)>;
using Undo = std::function<nlohmann::json(pqxx::work& tx, const Request& request,
                                          const ActionRecord& action)>;
using ExternalEffect = std::function<Response(const ExternalCall& call)>;
using ExternalUndo =
    std::function<nlohmann::json(const ExternalCall& call, const ActionRecord& action)>;

struct ParticipantServiceOptions {
  std::string name;           // in logs and metrics; 1..32 of [a-z0-9_]
  std::string database_url;   // postgresql://...: its keys and its own tables
  std::string service_token;  // what callers present as `Authorization: Bearer ...`
  // How long step keys are kept: longer than the orchestrator's retention plus its longest
  // saga (the orchestrator checks at start-up).
  std::chrono::hours retention{24 * 7};
  size_t pool_size = 8;  // database connections
  size_t threads = 16;   // requests handled at once
  // redis://[:password@]host[:port][/db]: keep the keys in that Redis instead of PostgreSQL;
  // database_url is then not used. Redis must keep what it acknowledges: Start checks that it
  // has appendonly yes, `redis_fsync`, and no eviction (maxmemory-policy noeviction).
  std::string redis_url;
  // With redis_url: "everysec" (appendfsync everysec or always: a crash of Redis' host may
  // lose about a second of keys), "always", or "unchecked" (CONFIG disabled; you vouch).
  std::string redis_fsync = "everysec";
  // Tenants on several PostgreSQL clusters (docs/scaling.md): postgresql:// URL of the
  // directory database and the name of the cluster `database_url` is on. Only the tenants
  // placed there are served; the others are answered 503 + Retry-After. Both empty: all.
  std::string placement_url;
  std::string cluster;
  // A request whose key a concurrent duplicate holds: "wait" (for the duplicate to commit,
  // then replay its answer) or "fail-fast" (409 + Retry-After at once).
  std::string duplicates = "wait";
  // Commands from RabbitMQ too (docs/messaging.md): amqp://user:password@host:port/vhost, one
  // per node of a cluster (consumers connect to the first and, when a connection breaks, to
  // the next). Empty: HTTP only. Each message on `amqp_queue` is a POST to the route its
  // header `path` names, with the HTTP request's headers and body: it goes through the same
  // route and guard, and its answer (the same bytes) is published to its reply_to before the
  // message is acknowledged; refused ones go to `<amqp_queue>.dead`.
  std::vector<std::string> amqp_urls;
  std::string amqp_queue;                   // "": the participant's name
  std::string amqp_queue_type = "classic";  // or "quorum": what a missing queue is declared as
  int amqp_consumers = 2;                   // connections, each with one message in hand
  // How long a message whose answer says "come back" (503, 409 in progress) is tried again in
  // hand before it goes back to the queue.
  std::chrono::milliseconds amqp_max_wait{std::chrono::minutes(2)};
  // Where the keys are kept: "postgres" (database_url), "redis" (redis_url) or "dynamodb"
  // (dynamodb_url). Empty: redis when redis_url is set, else postgres.
  std::string store;
  // With store "dynamodb": http://host[:port] of DynamoDB's API (plain HTTP: an emulator, or a
  // local TLS-terminating proxy to AWS; docs/dynamodb.md). The region and credentials come from
  // AWS_REGION (or AWS_DEFAULT_REGION), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
  // AWS_SESSION_TOKEN. Start creates `dynamodb_table` when it is missing.
  std::string dynamodb_url;
  std::string dynamodb_table = "idempotency_keys";
  // How often keys past their retention are deleted from PostgreSQL, in batches, from Start
  // on. Redis expires its keys itself; on DynamoDB the table's TTL deletes them, and reads
  // never see an expired one meanwhile.
  std::chrono::milliseconds gc_interval{std::chrono::minutes(1)};
};

class Participant {
 public:
  // Throws std::invalid_argument for a bad name.
  explicit Participant(ParticipantServiceOptions options);
  ~Participant();
  Participant(const Participant&) = delete;
  Participant& operator=(const Participant&) = delete;

  // SQL run at Start, after the guard's own migrations (its key table): the participant's
  // tables, written to be run again (CREATE TABLE IF NOT EXISTS ...).
  Participant& Schema(std::string sql);
  // POST `path`: an effect in the database, at most once per (tenant, key).
  Participant& Action(const std::string& path, Validate validate, Effect effect);
  // POST `path` with {"action_key", "action_applied"}: undoes that action once.
  Participant& Compensation(const std::string& path, Undo undo);
  // The same for effects outside the database (no transaction open during the call).
  Participant& ExternalAction(const std::string& path, Validate validate, ExternalEffect effect);
  Participant& ExternalCompensation(const std::string& path, ExternalUndo undo);

  // Migrates, binds `host:port` (0: any free port) and serves on threads of its own;
  // returns the port. Throws std::invalid_argument without its store's URL or a service
  // token, or for a PostgreSQL-only route on Redis or DynamoDB; std::runtime_error when the
  // store (or Redis' persistence) or the port cannot be had.
  int Start(const std::string& host, int port);
  // A participant binary's main: --listen HOST:PORT, --database-url (IDEMSAGA_DATABASE_URL),
  // --service-token (IDEMSAGA_SERVICE_TOKEN), --retention-hours, --store (IDEMSAGA_STORE),
  // --redis-url (IDEMSAGA_REDIS_URL), --redis-fsync, --dynamodb-url (IDEMSAGA_DYNAMODB_URL),
  // --dynamodb-table, --duplicates, --placement-url, --cluster, --amqp-url (IDEMSAGA_AMQP_URL;
  // repeatable or comma-separated), --amqp-queue, --amqp-queue-type, --amqp-consumers,
  // --amqp-max-wait-ms; prints
  // "<name> ready on <url>", serves until SIGTERM or SIGINT, then stops. Returns the exit code.
  int Run(int argc, char** argv);
  std::string Url() const;  // http://host:port once started
  // Stops serving (the requests in hand finish). Idempotent; also on destruction.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemsaga
