#include "steps/saga/fields.hpp"

namespace idemsaga {

Fields::Fields(const nlohmann::json& object, std::string at) : object_(object), at_(std::move(at)) {
  if (!object_.is_object()) {
    throw InvalidInput(at_.empty() ? "the body must be a JSON object"
                                   : at_.substr(0, at_.size() - 1) + " must be an object");
  }
}

void Fields::Fail(const char* name, const std::string& rule) const {
  throw InvalidInput(at_ + name + " " + rule);
}

const nlohmann::json& Fields::Get(const char* name) {
  auto it = object_.find(name);
  if (it == object_.end()) Fail(name, "is required");
  read_.insert(name);
  return *it;
}

std::string Fields::Text(const char* name, size_t max_length) {
  const auto& v = Get(name);
  std::string rule =
      "must be a string of 1-" + std::to_string(max_length) + " printable characters";
  if (!v.is_string()) Fail(name, rule);
  const auto& s = v.get_ref<const std::string&>();
  if (s.empty() || s.size() > max_length) Fail(name, rule);
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) Fail(name, rule);
  }
  return s;
}

long long Fields::Integer(const char* name, long long lo, long long hi) {
  const auto& v = Get(name);
  bool ok =
      v.is_number_integer() && !(v.is_number_unsigned() &&
                                 v.get<unsigned long long>() > static_cast<unsigned long long>(hi));
  if (ok) {
    auto n = v.get<long long>();
    if (n >= lo && n <= hi) return n;
  }
  Fail(name, "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
}

const nlohmann::json& Fields::Raw(const char* name) { return Get(name); }

Fields Fields::Object(const char* name) { return Fields(Get(name), at_ + name + "."); }

void Fields::Done() const {
  for (const auto& [name, value] : object_.items()) {
    if (read_.count(name)) continue;
    std::string message = at_.empty() ? "" : at_.substr(0, at_.size() - 1) + " has ";
    message += "unknown field '" + name + "'";
    throw InvalidInput(message);
  }
}

}  // namespace idemsaga
