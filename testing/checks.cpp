// The test kit's checks (include/idemsaga/testing.hpp): one run, a crash at every point of a
// run compared with the run that did not crash, and two runs' request bodies compared.
#include <set>
#include <stdexcept>

#include "common/strings.hpp"
#include "testing/world.hpp"

namespace idemsaga::testing {

using Shared = detail::World;

namespace {

struct Built {
  std::unique_ptr<Environment> env;
  std::optional<Definition> definition;
};

Built Build(const SagaFactory& factory, const CheckOptions& options) {
  Built b;
  b.env = std::make_unique<Environment>(options.run);
  if (options.setup) options.setup(*b.env);
  b.definition = factory(b.env->participants());
  if (!b.definition) throw std::invalid_argument("the factory serves no saga here");
  return b;
}

std::string Names(const std::vector<std::string>& names) {
  return "[" + common::Join(names, ", ") + "]";
}

// How `got` differs from `want`, one line per difference.
std::vector<std::string> Compare(const Result& want, const Result& got) {
  std::vector<std::string> out;
  if (got.end != want.end) {
    out.push_back(std::string("ended ") + ToString(got.end) + " (" + got.stuck_detail +
                  "), the reference " + ToString(want.end));
  }
  if (got.status != want.status || got.body != want.body) {
    out.push_back("answered " + std::to_string(got.status) + " " + got.body.dump() +
                  ", the reference " + std::to_string(want.status) + " " + want.body.dump());
  }
  if (got.compensated != want.compensated) {
    out.push_back("compensated " + Names(got.compensated) + ", the reference " +
                  Names(want.compensated));
  }
  for (const auto& w : want.steps) {
    const StepRecord* g = got.Step(w.name);
    if (g != nullptr && g->status != w.status) {
      out.push_back("step " + w.name + " ended " + g->status + ", the reference " + w.status);
    }
  }
  std::set<std::string> keys;
  for (const auto& [k, n] : want.effects) keys.insert(k);
  for (const auto& [k, n] : got.effects) keys.insert(k);
  for (const auto& k : keys) {
    auto w = want.effects.count(k) ? want.effects.at(k) : 0;
    auto g = got.effects.count(k) ? got.effects.at(k) : 0;
    if (g > 1) out.push_back(k + " applied " + std::to_string(g) + " times");
    if ((g > 0) != (w > 0)) {
      out.push_back(k + (g > 0 ? " applied" : " not applied") + ", the reference " +
                    (w > 0 ? "applied" : "not applied"));
    }
  }
  return out;
}

}  // namespace

Result Run(const SagaFactory& factory, const nlohmann::json& input, const CheckOptions& options) {
  Built b = Build(factory, options);
  return b.env->Run(*b.definition, input);
}

CrashReport CheckCrashes(const SagaFactory& factory, const nlohmann::json& input,
                         const CheckOptions& options) {
  CrashReport report;
  std::vector<std::string> where;
  {
    Built b = Build(factory, options);
    report.reference = b.env->Run(*b.definition, input);
    Shared& s = CheckAccess::Of(*b.env);
    std::lock_guard lock(s.mu);
    where = s.where;
  }
  report.points = static_cast<int>(where.size());
  for (int k = 1; k <= report.points; ++k) {
    Built b = Build(factory, options);
    {
      Shared& s = CheckAccess::Of(*b.env);
      std::lock_guard lock(s.mu);
      s.crash_at = k;
    }
    Result got = b.env->Run(*b.definition, input);
    auto diffs = Compare(report.reference, got);
    if (!diffs.empty()) {
      report.differences.push_back({k, where[k - 1], common::Join(diffs, "; ")});
    }
  }
  return report;
}

std::vector<BodyDifference> CheckDeterministic(const SagaFactory& factory,
                                               const nlohmann::json& input,
                                               const CheckOptions& options) {
  auto first_bodies = [](const Result& r) {
    std::map<std::string, Call> out;  // derived key -> its first call
    for (const auto& c : r.calls) out.emplace(c.derived_key, c);
    return out;
  };
  auto a = first_bodies(Run(factory, input, options));
  auto b = first_bodies(Run(factory, input, options));
  std::set<std::string> keys;
  for (const auto& [k, c] : a) keys.insert(k);
  for (const auto& [k, c] : b) keys.insert(k);
  std::vector<BodyDifference> out;
  for (const auto& k : keys) {
    auto x = a.find(k);
    auto y = b.find(k);
    std::string first = x != a.end() ? x->second.path + " " + x->second.body.dump() : "";
    std::string second = y != b.end() ? y->second.path + " " + y->second.body.dump() : "";
    if (first == second) continue;
    const Call& c = x != a.end() ? x->second : y->second;
    out.push_back({c.step, c.participant, k, first, second});
  }
  return out;
}

}  // namespace idemsaga::testing
