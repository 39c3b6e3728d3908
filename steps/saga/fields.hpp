// Reads a JSON object into a struct field by field, for a saga's typed input: every rule
// broken throws saga::InvalidInput naming the field ("address.country must be ..."), and
// Done() refuses any field that was not read, so a misspelt field is an error, not a default.
//
// A plain value over a JSON document that must outlive it; not shared between threads.
//   saga::Fields f(body);
//   ShipOrder in{f.Text("customer_id", 64), f.Integer("amount_cents", 1, 100000000)};
//   f.Done();
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "steps/saga/definition.hpp"

namespace saga {

class Fields {
 public:
  // Throws InvalidInput unless `object` is a JSON object. `at` prefixes field names in
  // messages ("address.").
  explicit Fields(const nlohmann::json& object, std::string at = "");

  // A string of 1..max_length bytes without control characters (UTF-8 is kept as sent).
  std::string Text(const char* name, size_t max_length);
  // An integer (not 2.5, not 1e3) from lo to hi.
  long long Integer(const char* name, long long lo, long long hi);
  // Any JSON value, present (checked by the caller, e.g. with a wire schema of its own).
  const nlohmann::json& Raw(const char* name);
  // A nested object, read the same way (its Done() is the caller's to call).
  Fields Object(const char* name);
  // Throws InvalidInput for the first field that was not read.
  void Done() const;

 private:
  const nlohmann::json& Get(const char* name);
  [[noreturn]] void Fail(const char* name, const std::string& rule) const;

  const nlohmann::json& object_;
  std::string at_;
  std::set<std::string> read_;
};

}  // namespace saga
