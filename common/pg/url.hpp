// libpq connection URIs (postgresql://user@host:port/dbname?k=v): the one form idemsaga prints,
// takes in flags and environment variables, and passes to libpq. Pure functions.
#pragma once

#include <string>
#include <string_view>

namespace idemsaga::common::pg {

// `url` with its database replaced by `dbname` (query parameters kept).
std::string WithDatabase(std::string_view url, std::string_view dbname);

// `url` with `key=value` appended to its query string (value percent-encoded).
std::string WithParam(std::string_view url, std::string_view key, std::string_view value);

// The database name of `url`, or "" when it names none.
std::string DatabaseOf(std::string_view url);

// Timeouts belong in the connection string: libpqxx 6.4 silently reconnects after a dropped
// session and would lose anything set with SET. Values in milliseconds.
struct SessionTimeouts {
  int connect_timeout_s = 3;
  int statement_timeout_ms = 5000;
  int lock_timeout_ms = 3000;
  int idle_in_transaction_timeout_ms = 10000;
  // The client's own, for a server it can no longer hear (a partition, a host gone): the
  // server's timeouts above cannot end a statement whose answer is lost on the way. Bytes
  // unacknowledged this long end the connection (TCP_USER_TIMEOUT), and so does an idle wait
  // whose keepalive probes go unanswered (5 s, then 3 probes 2 s apart).
  int tcp_user_timeout_ms = 10000;
  int keepalives_idle_s = 5;
  int keepalives_interval_s = 2;
  int keepalives_count = 3;
};
std::string WithSessionTimeouts(std::string_view url, const SessionTimeouts& t = {});

}  // namespace idemsaga::common::pg
