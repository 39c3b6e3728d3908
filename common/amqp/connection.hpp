// One AMQP 0-9-1 connection to RabbitMQ (rabbitmq-c underneath) with one channel: what the
// order intake and its tests need, and no more. Messages go through the default exchange,
// straight to a queue by name.
//
// Not thread-safe (nor is rabbitmq-c's connection): one thread owns a Connection. Every
// failure (the broker gone, a channel closed by it, a timeout, a consumer cancelled by the
// broker) throws AmqpError, after which the connection is unusable: make a new one. The RPCs
// (declare, qos, consume) have no timeout of their own (amqp_set_rpc_timeout is not set): they
// wait on the broker's TCP connection, whose heartbeat (30 s) ends a dead one; publishes,
// confirms and deliveries wait at most `timeout`.
//   amqp::Connection c("amqp://guest:guest@127.0.0.1:5672/");
//   c.DeclareQueue("orders"); c.Confirm(); c.Publish("orders", {.body = "{}"});
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace idemsaga::common::amqp {

struct AmqpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Message {
  // Headers with string values; a header of another type is listed in `other_headers`.
  std::map<std::string, std::string> headers;
  std::map<std::string, char> other_headers;  // name -> AMQP field kind
  std::string content_type;
  std::string message_id;
  std::string correlation_id;
  std::string reply_to;
  std::string body;
  bool persistent = true;  // delivery mode 2: a durable queue keeps it across a broker restart
};

struct Delivery {
  uint64_t tag = 0;
  bool redelivered = false;
  Message message;
};

// Throws std::invalid_argument unless `url` is an amqp:// URL (a bad flag fails at start-up,
// not at every reconnect).
void CheckUrl(const std::string& url);

// "host:port" of an amqp:// URL, without its credentials: what a log line may name.
std::string Address(const std::string& url);

// What kind of queue DeclareQueue creates. A quorum queue (RabbitMQ 3.8 and later) is
// replicated on the cluster's nodes (Raft): it outlives a node, which a classic queue on that
// node does not.
enum class QueueType { kClassic, kQuorum };

class Connection {
 public:
  // amqp://user:password@host:port/vhost (the AMQP URI spec: guest:guest@localhost:5672 for
  // parts left out; no path is the vhost "/", which as a path is %2f, while a bare trailing
  // "/" names the vhost ""). `timeout` bounds the connect and the waits for confirms.
  explicit Connection(const std::string& url,
                      std::chrono::milliseconds timeout = std::chrono::seconds(5));
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // A durable queue (a classic one is declared with no arguments, a quorum one with
  // x-queue-type); one that exists already is used as it is (of the other type, say, or
  // declared with other arguments). Returns how many messages it holds.
  uint32_t DeclareQueue(const std::string& queue, QueueType type = QueueType::kClassic);
  void DeleteQueue(const std::string& queue);
  // Publisher confirms: from now on Publish returns once the broker has the message (on disk,
  // for a persistent message to a durable queue) and throws if it refused it.
  void Confirm();
  // At most `count` unacknowledged deliveries at a time.
  void Prefetch(uint16_t count);
  void Consume(const std::string& queue);
  // The next delivery, or nullopt when none came within `wait`.
  std::optional<Delivery> Next(std::chrono::milliseconds wait);
  void Ack(uint64_t tag);
  // requeue: back to the queue (redelivered later); otherwise dropped.
  void Reject(uint64_t tag, bool requeue);
  // `mandatory`: a message no queue takes is an error (AmqpError), not silently dropped.
  void Publish(const std::string& queue, const Message& message, bool mandatory = false);
  // One message taken from `queue` and acknowledged at once (basic.get), or nullopt if empty.
  std::optional<Message> Get(const std::string& queue);
  // Services the connection (heartbeats) for `wait` while its owner has nothing else to do
  // with it; throws if the broker closed it meanwhile.
  void Idle(std::chrono::milliseconds wait);

 private:
  void Check(const char* what);  // throws unless the last RPC succeeded
  // Handles a frame that arrived out of turn: throws on a channel or connection close; keeps a
  // delivery (its content read) for Next.
  void OutOfTurn(const void* frame);
  // False when the message came back unroutable (mandatory) before its confirm.
  bool WaitForConfirm();
  // Marks the connection unusable (closed without the handshake) and makes the error.
  AmqpError Broken(const std::string& what);
  void OpenChannel();

  void* state_;  // amqp_connection_state_t
  int channel_ = 0;
  bool confirms_ = false;
  bool broken_ = false;
  uint64_t published_ = 0;  // publish sequence number, for confirms
  // Deliveries that arrived while a confirm was awaited (prefetch above 1, or a consumer that
  // publishes after its ack): Next hands them out first, in order.
  std::deque<Delivery> pending_;
  std::chrono::milliseconds timeout_;
};

}  // namespace idemsaga::common::amqp
