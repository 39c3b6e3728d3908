#include "demo/faults.hpp"

#include <chrono>
#include <random>
#include <thread>

namespace idemsaga::demo {

std::optional<FaultSettings> ParseFaultSettings(const nlohmann::json& j, std::string& error) {
  if (!j.is_object()) {
    error = "the body must be a JSON object";
    return std::nullopt;
  }
  FaultSettings s;
  for (const auto& [name, value] : j.items()) {
    if (name == "error_rate" || name == "drop_after_commit_rate") {
      if (!value.is_number() || value.get<double>() < 0 || value.get<double>() > 1) {
        error = name + " must be a number from 0 to 1";
        return std::nullopt;
      }
      (name == "error_rate" ? s.error_rate : s.drop_after_commit_rate) = value.get<double>();
    } else if (name == "fail_next") {
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() > 1000000) {
        error = "fail_next must be an integer from 0 to 1000000";
        return std::nullopt;
      }
      s.fail_next = value.get<int>();
    } else if (name == "retry_after_s") {
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() > 3600) {
        error = "retry_after_s must be an integer from 0 to 3600";
        return std::nullopt;
      }
      s.retry_after_s = value.get<int>();
    } else if (name == "key_prefix") {
      if (!value.is_string() || value.get_ref<const std::string&>().size() > 255) {
        error = "key_prefix must be a string of at most 255 bytes";
        return std::nullopt;
      }
      s.key_prefix = value.get<std::string>();
    } else if (name == "latency_ms") {
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() > 600000) {
        error = "latency_ms must be an integer from 0 to 600000";
        return std::nullopt;
      }
      s.latency_ms = value.get<int>();
    } else if (name == "hang") {
      if (!value.is_boolean()) {
        error = "hang must be true or false";
        return std::nullopt;
      }
      s.hang = value.get<bool>();
    } else {
      error = "unknown field '" + name + "'";
      return std::nullopt;
    }
  }
  return s;
}

nlohmann::json ToJson(const FaultSettings& s) {
  return {{"error_rate", s.error_rate},
          {"fail_next", s.fail_next},
          {"retry_after_s", s.retry_after_s},
          {"key_prefix", s.key_prefix},
          {"drop_after_commit_rate", s.drop_after_commit_rate},
          {"latency_ms", s.latency_ms},
          {"hang", s.hang}};
}

FaultSettings Faults::Get() const {
  std::lock_guard lock(mutex_);
  return settings_;
}

void Faults::Set(const FaultSettings& s) {
  std::lock_guard lock(mutex_);
  settings_ = s;
}

bool Faults::Roll(double rate) {
  if (rate <= 0) return false;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0, 1)(rng) < rate;
}

std::optional<int> Faults::Fail(std::string_view key) {
  double rate;
  int retry_after_s;
  {
    std::lock_guard lock(mutex_);
    if (!key.starts_with(settings_.key_prefix)) return std::nullopt;
    retry_after_s = settings_.retry_after_s;
    if (settings_.fail_next > 0) {
      --settings_.fail_next;
      return retry_after_s;
    }
    rate = settings_.error_rate;
  }
  if (!Roll(rate)) return std::nullopt;
  return retry_after_s;
}

bool Faults::ShouldDropAfterCommit() { return Roll(Get().drop_after_commit_rate); }

void Faults::DelayAnswer() const {
  int ms = Get().latency_ms;
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void Faults::HoldWhileHung() const {
  while (Get().hang && !released_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace idemsaga::demo
