#include "common/amqp/connection.hpp"

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <sys/time.h>

#include <vector>

namespace idemsaga::common::amqp {
namespace {

amqp_connection_state_t S(void* state) { return static_cast<amqp_connection_state_t>(state); }

amqp_bytes_t Bytes(const std::string& s) {
  return {s.size(), const_cast<char*>(s.data())};  // rabbitmq-c only reads it
}

std::string Str(const amqp_bytes_t& b) {
  return b.len == 0 ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}

timeval TimeVal(std::chrono::milliseconds d) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return {static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
}

std::string Describe(const amqp_rpc_reply_t& r) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return "ok";
    case AMQP_RESPONSE_NONE:
      return "no reply";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return amqp_error_string2(r.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* m = static_cast<amqp_channel_close_t*>(r.reply.decoded);
        return "channel closed by the broker: " + std::to_string(m->reply_code) + " " +
               Str(m->reply_text);
      }
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* m = static_cast<amqp_connection_close_t*>(r.reply.decoded);
        return "connection closed by the broker: " + std::to_string(m->reply_code) + " " +
               Str(m->reply_text);
      }
      return "broker exception";
  }
  return "unknown reply";
}

Message FromProperties(const amqp_basic_properties_t& p, const amqp_bytes_t& body) {
  Message m;
  if (p._flags & AMQP_BASIC_HEADERS_FLAG) {
    for (int i = 0; i < p.headers.num_entries; ++i) {
      const auto& e = p.headers.entries[i];
      std::string key = Str(e.key);
      if (e.value.kind == AMQP_FIELD_KIND_UTF8 || e.value.kind == AMQP_FIELD_KIND_BYTES) {
        m.headers[key] = Str(e.value.value.bytes);
      } else {
        m.other_headers[key] = static_cast<char>(e.value.kind);
      }
    }
  }
  if (p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) m.content_type = Str(p.content_type);
  if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) m.message_id = Str(p.message_id);
  if (p._flags & AMQP_BASIC_CORRELATION_ID_FLAG) m.correlation_id = Str(p.correlation_id);
  if (p._flags & AMQP_BASIC_REPLY_TO_FLAG) m.reply_to = Str(p.reply_to);
  m.persistent = (p._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) && p.delivery_mode == 2;
  m.body = Str(body);
  return m;
}

// rabbitmq-c parses in place: `buf` holds the strings `info` points into.
bool ParseUrl(const std::string& url, std::vector<char>& buf, amqp_connection_info& info) {
  buf.assign(url.begin(), url.end());
  buf.push_back('\0');
  amqp_default_connection_info(&info);
  return url.empty() || amqp_parse_url(buf.data(), &info) == AMQP_STATUS_OK;
}

}  // namespace

void CheckUrl(const std::string& url) {
  std::vector<char> buf;
  amqp_connection_info info;
  if (url.empty() || !ParseUrl(url, buf, info)) {
    throw std::invalid_argument("--amqp-url is not an amqp:// URL");  // no echo: credentials
  }
}

std::string Address(const std::string& url) {
  std::vector<char> buf;
  amqp_connection_info info;
  if (!ParseUrl(url, buf, info)) return "?";
  return std::string(info.host) + ":" + std::to_string(info.port);
}

Connection::Connection(const std::string& url, std::chrono::milliseconds timeout)
    : state_(amqp_new_connection()), timeout_(timeout) {
  if (state_ == nullptr) throw AmqpError("out of memory");
  std::vector<char> buf;
  amqp_connection_info info;
  if (!ParseUrl(url, buf, info)) {
    amqp_destroy_connection(S(state_));
    throw AmqpError("not an amqp:// URL");
  }
  amqp_socket_t* socket = amqp_tcp_socket_new(S(state_));
  timeval tv = TimeVal(timeout_);
  int rc = socket == nullptr ? AMQP_STATUS_NO_MEMORY
                             : amqp_socket_open_noblock(socket, info.host, info.port, &tv);
  if (rc != AMQP_STATUS_OK) {
    amqp_destroy_connection(S(state_));
    throw AmqpError(std::string("cannot connect to the broker: ") + amqp_error_string2(rc));
  }
  // A heartbeat lets both ends notice a dead peer; Idle() keeps it going while a message is
  // in hand.
  // consumer_cancel_notify: the broker tells us when it drops our consumer (its queue was
  // deleted), instead of deliveries stopping without a word.
  amqp_table_entry_t capability{};
  capability.key = amqp_cstring_bytes("consumer_cancel_notify");
  capability.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  capability.value.value.boolean = 1;
  amqp_table_entry_t property{};
  property.key = amqp_cstring_bytes("capabilities");
  property.value.kind = AMQP_FIELD_KIND_TABLE;
  property.value.value.table = {1, &capability};
  amqp_table_t properties{1, &property};
  auto login =
      amqp_login_with_properties(S(state_), info.vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 30, &properties,
                                 AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  if (login.reply_type != AMQP_RESPONSE_NORMAL) {
    amqp_destroy_connection(S(state_));
    throw AmqpError("broker login failed: " + Describe(login));
  }
  try {
    OpenChannel();
  } catch (...) {
    amqp_destroy_connection(S(state_));
    throw;
  }
}

Connection::~Connection() {
  // Unacknowledged deliveries go back to their queue when the connection closes. After a
  // failure the socket is simply closed: the close handshake could wait on a broker that no
  // longer reads (no RPC timeout is set: see the header).
  if (!broken_) {
    amqp_channel_close(S(state_), channel_, AMQP_REPLY_SUCCESS);
    amqp_connection_close(S(state_), AMQP_REPLY_SUCCESS);
  }
  amqp_destroy_connection(S(state_));
}

AmqpError Connection::Broken(const std::string& what) {
  broken_ = true;
  return AmqpError(what);
}

void Connection::OpenChannel() {
  ++channel_;
  amqp_channel_open(S(state_), channel_);
  Check("channel.open");
}

void Connection::Check(const char* what) {
  auto r = amqp_get_rpc_reply(S(state_));
  if (r.reply_type != AMQP_RESPONSE_NORMAL) throw Broken(std::string(what) + ": " + Describe(r));
}

uint32_t Connection::DeclareQueue(const std::string& queue, QueueType type) {
  // Quorum queues must be durable, non-exclusive and not auto-deleted, as every queue here is.
  amqp_table_entry_t quorum{};
  quorum.key = amqp_cstring_bytes("x-queue-type");
  quorum.value.kind = AMQP_FIELD_KIND_UTF8;
  quorum.value.value.bytes = amqp_cstring_bytes("quorum");
  amqp_table_t arguments = type == QueueType::kQuorum ? amqp_table_t{1, &quorum} : amqp_empty_table;
  auto* ok = amqp_queue_declare(S(state_), channel_, Bytes(queue), 0, 1, 0, 0, arguments);
  if (ok != nullptr) return ok->message_count;
  auto r = amqp_get_rpc_reply(S(state_));
  if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || r.reply.id != AMQP_CHANNEL_CLOSE_METHOD ||
      static_cast<amqp_channel_close_t*>(r.reply.decoded)->reply_code != AMQP_PRECONDITION_FAILED) {
    throw Broken("queue.declare " + queue + ": " + Describe(r));
  }
  // It exists with other properties (declared by its owner): use it as it is, on a new
  // channel (the broker closed this one).
  amqp_channel_close_ok_t close_ok{};
  amqp_send_method(S(state_), channel_, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok);
  OpenChannel();
  if (confirms_) {
    amqp_confirm_select(S(state_), channel_);
    Check("confirm.select");
    published_ = 0;
  }
  ok = amqp_queue_declare(S(state_), channel_, Bytes(queue), 1, 0, 0, 0, amqp_empty_table);
  if (ok == nullptr) Check(("queue.declare (passive) " + queue).c_str());
  return ok->message_count;
}

void Connection::DeleteQueue(const std::string& queue) {
  amqp_queue_delete(S(state_), channel_, Bytes(queue), 0, 0);
  Check(("queue.delete " + queue).c_str());
}

void Connection::Confirm() {
  amqp_confirm_select(S(state_), channel_);
  Check("confirm.select");
  confirms_ = true;
  published_ = 0;
}

void Connection::Prefetch(uint16_t count) {
  amqp_basic_qos(S(state_), channel_, 0, count, 0);
  Check("basic.qos");
}

void Connection::Consume(const std::string& queue) {
  amqp_basic_consume(S(state_), channel_, Bytes(queue), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  Check(("basic.consume " + queue).c_str());
}

std::optional<Delivery> Connection::Next(std::chrono::milliseconds wait) {
  if (!pending_.empty()) {
    Delivery d = std::move(pending_.front());
    pending_.pop_front();
    return d;
  }
  amqp_maybe_release_buffers(S(state_));
  amqp_envelope_t envelope;
  timeval tv = TimeVal(wait);
  auto r = amqp_consume_message(S(state_), &envelope, &tv, 0);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) {
    Delivery d{envelope.delivery_tag, envelope.redelivered != 0,
               FromProperties(envelope.message.properties, envelope.message.body)};
    amqp_destroy_envelope(&envelope);
    return d;
  }
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
    if (r.library_error == AMQP_STATUS_TIMEOUT) return std::nullopt;
    if (r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
      amqp_frame_t frame;
      if (amqp_simple_wait_frame(S(state_), &frame) != AMQP_STATUS_OK) {
        throw Broken("connection to the broker lost");
      }
      OutOfTurn(&frame);
      return std::nullopt;
    }
  }
  throw Broken("basic.consume: " + Describe(r));
}

void Connection::OutOfTurn(const void* f) {
  const auto& frame = *static_cast<const amqp_frame_t*>(f);
  if (frame.frame_type != AMQP_FRAME_METHOD) return;
  switch (frame.payload.method.id) {
    case AMQP_CHANNEL_CLOSE_METHOD: {
      const auto* m = static_cast<amqp_channel_close_t*>(frame.payload.method.decoded);
      throw Broken("channel closed by the broker: " + std::to_string(m->reply_code) + " " +
                   Str(m->reply_text));
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
      const auto* m = static_cast<amqp_connection_close_t*>(frame.payload.method.decoded);
      throw Broken("connection closed by the broker: " + std::to_string(m->reply_code) + " " +
                   Str(m->reply_text));
    }
    case AMQP_BASIC_CANCEL_METHOD:
      throw Broken("the broker cancelled the consumer (its queue was deleted?)");
    case AMQP_BASIC_DELIVER_METHOD: {  // its content frames follow: read them now
      const auto* m = static_cast<amqp_basic_deliver_t*>(frame.payload.method.decoded);
      Delivery d{m->delivery_tag, m->redelivered != 0, {}};
      amqp_message_t message;
      auto r = amqp_read_message(S(state_), frame.channel, &message, 0);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) throw Broken("basic.deliver: " + Describe(r));
      d.message = FromProperties(message.properties, message.body);
      amqp_destroy_message(&message);
      pending_.push_back(std::move(d));
      return;
    }
    default:
      return;  // basic.ack of a confirm nobody waits for, and the like
  }
}

void Connection::Ack(uint64_t tag) {
  if (amqp_basic_ack(S(state_), channel_, tag, 0) != AMQP_STATUS_OK) {
    throw Broken("basic.ack failed: connection to the broker lost");
  }
}

void Connection::Reject(uint64_t tag, bool requeue) {
  if (amqp_basic_reject(S(state_), channel_, tag, requeue ? 1 : 0) != AMQP_STATUS_OK) {
    throw Broken("basic.reject failed: connection to the broker lost");
  }
}

void Connection::Publish(const std::string& queue, const Message& m, bool mandatory) {
  std::vector<amqp_table_entry_t> entries;
  entries.reserve(m.headers.size());
  for (const auto& [k, v] : m.headers) {
    amqp_table_entry_t e{};
    e.key = Bytes(k);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = Bytes(v);
    entries.push_back(e);
  }
  amqp_basic_properties_t p{};
  p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG;
  p.delivery_mode = m.persistent ? AMQP_DELIVERY_PERSISTENT : AMQP_DELIVERY_NONPERSISTENT;
  p.headers = {static_cast<int>(entries.size()), entries.data()};
  auto set = [&p](const std::string& value, amqp_flags_t flag, amqp_bytes_t& field) {
    if (value.empty()) return;
    p._flags |= flag;
    field = Bytes(value);
  };
  set(m.content_type, AMQP_BASIC_CONTENT_TYPE_FLAG, p.content_type);
  set(m.message_id, AMQP_BASIC_MESSAGE_ID_FLAG, p.message_id);
  set(m.correlation_id, AMQP_BASIC_CORRELATION_ID_FLAG, p.correlation_id);
  set(m.reply_to, AMQP_BASIC_REPLY_TO_FLAG, p.reply_to);
  int rc = amqp_basic_publish(S(state_), channel_, amqp_empty_bytes, Bytes(queue),
                              mandatory ? 1 : 0, 0, &p, Bytes(m.body));
  if (rc != AMQP_STATUS_OK) {
    throw Broken(std::string("basic.publish failed: ") + amqp_error_string2(rc));
  }
  ++published_;
  if (confirms_ && !WaitForConfirm()) throw Broken("no queue named " + queue + ": not delivered");
}

bool Connection::WaitForConfirm() {
  bool routed = true;
  auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw Broken("no publisher confirm from the broker in time");
    amqp_frame_t frame;
    timeval tv = TimeVal(left);
    int rc = amqp_simple_wait_frame_noblock(S(state_), &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) continue;
    if (rc != AMQP_STATUS_OK) throw Broken("connection to the broker lost awaiting a confirm");
    if (frame.frame_type == AMQP_FRAME_METHOD) {
      if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD) {
        const auto* ack = static_cast<amqp_basic_ack_t*>(frame.payload.method.decoded);
        if (ack->delivery_tag >= published_) return routed;
        continue;
      }
      if (frame.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
        // A mandatory message no queue took: it comes back (its content follows), then the
        // confirm.
        amqp_message_t returned;
        auto r = amqp_read_message(S(state_), channel_, &returned, 0);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) throw Broken("basic.return: " + Describe(r));
        amqp_destroy_message(&returned);
        routed = false;
        continue;
      }
      if (frame.payload.method.id == AMQP_BASIC_NACK_METHOD) {
        throw Broken("the broker refused a published message (basic.nack)");
      }
    }
    OutOfTurn(&frame);
  }
}

std::optional<Message> Connection::Get(const std::string& queue) {
  amqp_maybe_release_buffers(S(state_));
  auto r = amqp_basic_get(S(state_), channel_, Bytes(queue), 1);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) throw Broken("basic.get: " + Describe(r));
  if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) return std::nullopt;
  amqp_message_t message;
  auto read = amqp_read_message(S(state_), channel_, &message, 0);
  if (read.reply_type != AMQP_RESPONSE_NORMAL) throw Broken("basic.get: " + Describe(read));
  Message m = FromProperties(message.properties, message.body);
  amqp_destroy_message(&message);
  return m;
}

void Connection::Idle(std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    amqp_frame_t frame;
    timeval tv = TimeVal(left);
    int rc = amqp_simple_wait_frame_noblock(S(state_), &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) return;
    if (rc != AMQP_STATUS_OK) throw Broken("connection to the broker lost");
    OutOfTurn(&frame);
  }
}

}  // namespace idemsaga::common::amqp
