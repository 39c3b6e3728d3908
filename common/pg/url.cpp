#include "common/pg/url.hpp"

#include <stdexcept>

#include "common/percent_encode.hpp"

namespace idemsaga::common::pg {
namespace {

struct Parts {
  std::string_view head;   // scheme://authority
  std::string_view db;     // without the leading '/'
  std::string_view query;  // without the leading '?'
};

Parts Split(std::string_view url) {
  auto scheme = url.find("://");
  if (scheme == std::string_view::npos) {
    throw std::invalid_argument("expected a postgresql:// URL, got '" + std::string(url) + "'");
  }
  auto q = url.find('?', scheme + 3);
  std::string_view before_query = url.substr(0, q);
  std::string_view query = q == std::string_view::npos ? "" : url.substr(q + 1);
  auto slash = before_query.find('/', scheme + 3);
  if (slash == std::string_view::npos) return {before_query, "", query};
  return {before_query.substr(0, slash), before_query.substr(slash + 1), query};
}

std::string Join(const Parts& p) {
  std::string out(p.head);
  out.append("/").append(p.db);
  if (!p.query.empty()) out.append("?").append(p.query);
  return out;
}

}  // namespace

std::string WithDatabase(std::string_view url, std::string_view dbname) {
  Parts p = Split(url);
  p.db = dbname;
  return Join(p);
}

std::string WithParam(std::string_view url, std::string_view key, std::string_view value) {
  Parts p = Split(url);
  std::string query(p.query);
  if (!query.empty()) query.push_back('&');
  query.append(key).append("=").append(common::PercentEncode(value));
  p.query = query;
  return Join(p);
}

std::string DatabaseOf(std::string_view url) { return std::string(Split(url).db); }

std::string WithSessionTimeouts(std::string_view url, const SessionTimeouts& t) {
  std::string options =
      "-c statement_timeout=" + std::to_string(t.statement_timeout_ms) +
      " -c lock_timeout=" + std::to_string(t.lock_timeout_ms) +
      " -c idle_in_transaction_session_timeout=" + std::to_string(t.idle_in_transaction_timeout_ms);
  std::string out(url);
  for (const auto& [key, value] :
       {std::pair<const char*, int>{"connect_timeout", t.connect_timeout_s},
        {"tcp_user_timeout", t.tcp_user_timeout_ms},
        {"keepalives_idle", t.keepalives_idle_s},
        {"keepalives_interval", t.keepalives_interval_s},
        {"keepalives_count", t.keepalives_count}}) {
    out = WithParam(out, key, std::to_string(value));
  }
  return WithParam(out, "options", options);
}

}  // namespace idemsaga::common::pg
