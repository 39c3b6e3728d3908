#include "steps/saga/definition.hpp"

#include <algorithm>
#include <stdexcept>

namespace idemsaga {

bool IsValidStepName(std::string_view name) {
  if (name.empty() || name.size() > 32 || name == "compensate") return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

std::string ActionKey(std::string_view parent_key, std::string_view step) {
  return std::string(parent_key) + "-" + std::string(step);
}

std::string CompensationKey(std::string_view parent_key, std::string_view step) {
  return ActionKey(parent_key, step) + "-compensate";
}

Definition::Definition(std::string name, int version) : name_(std::move(name)), version_(version) {
  if (!IsValidStepName(name_)) {
    throw std::invalid_argument("saga name '" + name_ + "' must be 1-32 of [a-z0-9_]");
  }
  if (version_ < 1) throw std::invalid_argument("saga '" + name_ + "': version must be >= 1");
}

std::shared_ptr<const std::any> Definition::ParseInput(const nlohmann::json& body) const {
  if (!parse_) return std::make_shared<const std::any>(body);
  return parse_(body);
}

Definition& Definition::Add(StepDefinition step) {
  if (!IsValidStepName(step.name)) {
    throw std::invalid_argument("step name '" + step.name +
                                "' must be 1-32 of [a-z0-9_] and not 'compensate'");
  }
  for (const auto& s : steps_) {
    if (s.name == step.name) {
      throw std::invalid_argument("duplicate step name '" + step.name + "'");
    }
  }
  steps_.push_back(std::move(step));
  return *this;
}

Definition& Definition::Step(std::string name, StepFn action, StepFn compensation,
                             StepPolicy policy) {
  if (!action || !compensation) {
    throw std::invalid_argument("step '" + name + "' needs an action and a compensation");
  }
  StepDefinition step;
  step.name = std::move(name);
  step.action = std::move(action);
  step.compensation = std::move(compensation);
  step.policy = policy;
  return Add(std::move(step));
}

Definition& Definition::Parallel(std::vector<Branch> branches) {
  if (branches.size() < 2 || branches.size() > 16) {
    throw std::invalid_argument("a parallel group needs 2 to 16 branches");
  }
  const int group = static_cast<int>(steps_.size());
  try {
    for (auto& b : branches) {
      Step(std::move(b.name), std::move(b.action), std::move(b.compensation), b.policy);
      steps_.back().group = group;
    }
  } catch (...) {
    steps_.erase(steps_.begin() + group, steps_.end());  // all of the group or none of it
    throw;
  }
  return *this;
}

Definition& Definition::Child(std::string name, Definition child, ChildInputFn input) {
  if (!input) throw std::invalid_argument("step '" + name + "' needs the child's input");
  // Events are addressed to the parent's run by name: two steps awaiting one name would take
  // each other's (a second child confirming a payment nobody confirmed).
  for (const auto& event : child.Events()) {
    if (Awaiting(event) != nullptr) {
      throw std::invalid_argument("event '" + event + "' of child '" + name +
                                  "' is awaited by another step");
    }
  }
  if (size_t suffix = 1 + name.size() + child.LongestKeySuffix(); suffix > kMaxKeySuffix) {
    throw std::invalid_argument("child '" + name + "' derives keys " + std::to_string(suffix) +
                                " bytes longer than the parent's; at most " +
                                std::to_string(kMaxKeySuffix) + " fit");
  }
  StepDefinition step;
  step.name = std::move(name);
  step.kind = StepKind::kChild;
  step.child = std::make_shared<const Definition>(std::move(child));
  step.child_input = std::move(input);
  return Add(std::move(step));
}

size_t Definition::LongestKeySuffix() const {
  size_t longest = 0;
  for (const auto& s : steps_) {
    size_t own = s.kind == StepKind::kChild ? s.child->LongestKeySuffix()
                                            : std::string_view("-compensate").size();
    longest = std::max(longest, 1 + s.name.size() + own);
  }
  return longest;
}

Definition& Definition::Sleep(std::string name, std::chrono::milliseconds duration) {
  if (duration.count() < 0) {
    throw std::invalid_argument("step '" + name + "': a sleep cannot be negative");
  }
  return SleepUntil(
      std::move(name), [duration](const StepContext& ctx) { return ctx.arrived_at + duration; },
      duration);
}

Definition& Definition::SleepUntil(std::string name, WakeFn until,
                                   std::chrono::milliseconds longest) {
  if (!until) throw std::invalid_argument("step '" + name + "' needs a wake-up time");
  if (longest.count() < 0) {
    throw std::invalid_argument("step '" + name + "': a sleep cannot be negative");
  }
  StepDefinition step;
  step.name = std::move(name);
  step.kind = StepKind::kTimer;
  step.wake_at = std::move(until);
  step.longest_wait = longest;
  return Add(std::move(step));
}

Definition& Definition::Await(std::string name, EventWait wait) {
  if (wait.events.empty()) {
    throw std::invalid_argument("step '" + name + "' must await at least one event");
  }
  if (wait.timeout.count() <= 0) {
    throw std::invalid_argument("step '" + name + "': the timeout must be positive");
  }
  for (const auto& event : wait.events) {
    if (!IsValidStepName(event)) {
      throw std::invalid_argument("event name '" + event + "' must be 1-32 of [a-z0-9_]");
    }
    if (Awaiting(event) != nullptr ||
        std::count(wait.events.begin(), wait.events.end(), event) > 1) {
      throw std::invalid_argument("event '" + event + "' is awaited by another step");
    }
  }
  StepDefinition step;
  step.name = std::move(name);
  step.kind = StepKind::kEvent;
  step.longest_wait = wait.timeout;
  step.wait = std::make_shared<const EventWait>(std::move(wait));
  return Add(std::move(step));
}

Definition& Definition::When(ConditionFn condition) {
  if (steps_.empty()) throw std::logic_error("When() applies to the step added last: add one");
  if (!condition) throw std::invalid_argument("step '" + steps_.back().name + "': no condition");
  const int group = steps_.back().group;
  for (auto& step : steps_) {
    if (&step == &steps_.back() || (group >= 0 && step.group == group)) step.when = condition;
  }
  return *this;
}

Definition& Definition::TypeOutput(OutputParser parse) {
  if (steps_.empty() || steps_.back().kind != StepKind::kCall) {
    throw std::logic_error("Output<T>() types the call added last: add one");
  }
  steps_.back().parse_output = std::move(parse);
  return *this;
}

Definition& Definition::Answer(AnswerFn answer) {
  if (!answer) throw std::invalid_argument("saga '" + name_ + "': no answer");
  answer_ = std::move(answer);
  return *this;
}

const StepDefinition* Definition::Awaiting(std::string_view event) const {
  for (const auto& step : steps_) {
    // A child's events are addressed to its parent's run.
    if (step.kind == StepKind::kChild) {
      if (const auto* in_child = step.child->Awaiting(event)) return in_child;
      continue;
    }
    if (step.kind != StepKind::kEvent) continue;
    for (const auto& e : step.wait->events) {
      if (e == event) return &step;
    }
  }
  return nullptr;
}

std::vector<std::string> Definition::Events() const {
  std::vector<std::string> out;
  for (const auto& step : steps_) {
    if (step.kind == StepKind::kChild) {
      for (auto& e : step.child->Events()) out.push_back(std::move(e));
    } else if (step.kind == StepKind::kEvent) {
      out.insert(out.end(), step.wait->events.begin(), step.wait->events.end());
    }
  }
  return out;
}

}  // namespace idemsaga

namespace idemsaga::steps::saga {

std::optional<DerivedKey> ParseDerivedKey(std::string_view key) {
  auto split =
      [](std::string_view k) -> std::optional<std::pair<std::string_view, std::string_view>> {
    auto dash = k.rfind('-');
    if (dash == std::string_view::npos || dash == 0) return std::nullopt;
    return std::pair{k.substr(0, dash), k.substr(dash + 1)};
  };
  auto last = split(key);
  if (!last) return std::nullopt;
  bool compensation = last->second == "compensate";
  if (compensation) last = split(last->first);
  if (!last || !IsValidStepName(last->second)) return std::nullopt;
  return DerivedKey{std::string(last->first), std::string(last->second), compensation};
}

}  // namespace idemsaga::steps::saga
