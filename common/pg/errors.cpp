#include "common/pg/errors.hpp"

#include <pqxx/pqxx>

#include "common/unavailable.hpp"

namespace idemsaga::common::pg {

Failure ClassifySqlState(const std::string& sqlstate) {
  if (sqlstate.size() != 5) return Failure::kDefect;
  const std::string cls = sqlstate.substr(0, 2);
  if (cls == "08" || cls == "40" || cls == "53" || cls == "58") return Failure::kUnavailable;
  // admin_shutdown, crash_shutdown, cannot_connect_now, database_dropped; a statement or
  // lock timeout; a standby that is not (or no longer) the primary.
  if (sqlstate == "57P01" || sqlstate == "57P02" || sqlstate == "57P03" || sqlstate == "57P04" ||
      sqlstate == "57014" || sqlstate == "55P03" || sqlstate == "25006") {
    return Failure::kUnavailable;
  }
  if (cls == "22" || cls == "23" || cls == "54") return Failure::kRejectedValue;
  return Failure::kDefect;
}

ClassifiedFailure Classify(const std::exception_ptr& ep) {
  ClassifiedFailure out;
  if (!ep) return out;
  try {
    std::rethrow_exception(ep);
  } catch (const Unavailable& e) {
    out = {Failure::kUnavailable, "", e.what()};
  } catch (const pqxx::sql_error& e) {
    // No SQLSTATE: libpq lost the server mid-statement.
    out = {e.sqlstate().empty() ? Failure::kUnavailable : ClassifySqlState(e.sqlstate()),
           e.sqlstate(), e.what()};
  } catch (const pqxx::failure& e) {
    // broken_connection, in_doubt_error: the connection, or whether a commit landed.
    out = {Failure::kUnavailable, "", e.what()};
  } catch (const std::exception& e) {
    out = {Failure::kDefect, "", e.what()};
  } catch (...) {
    out = {Failure::kDefect, "", "unknown exception"};
  }
  return out;
}

}  // namespace idemsaga::common::pg
