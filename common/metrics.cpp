#include "common/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <variant>

namespace idemsaga::common::metrics {

void Counter::Inc(double by) { value_.fetch_add(by, std::memory_order_relaxed); }

void Gauge::Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(bounds.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  std::lock_guard lock(mutex_);
  unsigned long long running = 0;
  for (auto c : counts_) s.cumulative.push_back(running += c);
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> DurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

template <class Metric>
Metric& Family<Metric>::With(const LabelValues& values) {
  if (values.size() != label_names_.size()) {
    throw std::logic_error("metric series needs " + std::to_string(label_names_.size()) +
                           " label values");
  }
  std::lock_guard lock(mutex_);
  auto& slot = series_[values];
  if (!slot) slot = make_();
  return *slot;
}

template <class Metric>
std::vector<std::pair<LabelValues, const Metric*>> Family<Metric>::Series() const {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<LabelValues, const Metric*>> out;
  for (const auto& [labels, metric] : series_) out.emplace_back(labels, metric.get());
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

struct Registry::Entry {
  std::string name, help, type;
  std::vector<std::string> labels;
  std::vector<double> bounds;
  std::variant<std::monostate, std::unique_ptr<Family<metrics::Counter>>,
               std::unique_ptr<Family<metrics::Gauge>>, std::unique_ptr<Family<metrics::Histogram>>,
               std::function<double()>>
      data;
};

Registry::Registry() = default;
Registry::~Registry() = default;

namespace {

bool ValidName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Prometheus' float format: integers without a fraction, +Inf spelt out.
std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  // The shortest text that reads back as the same double ("0.1", not "0.10000000000000001").
  auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

std::string Labels(const std::vector<std::string>& names, const LabelValues& values,
                   const std::string& extra_name = "", const std::string& extra_value = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (out.empty() ? "" : ",") + names[i] + "=\"" + EscapeLabel(values[i]) + "\"";
  }
  if (!extra_name.empty()) {
    out += (out.empty() ? "" : ",") + extra_name + "=\"" + extra_value + "\"";
  }
  return out.empty() ? "" : "{" + out + "}";
}

// Help text escapes backslash and newline; a label value, its double quote too.
std::string Escape(const std::string& text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabel(const std::string& value) { return Escape(value, true); }

Registry::Entry& Registry::Add(const std::string& name, const std::string& help, const char* type,
                               const std::vector<std::string>& labels) {
  if (!ValidName(name)) throw std::logic_error("invalid metric name: " + name);
  for (const auto& l : labels) {
    if (!ValidName(l) || l == "le") throw std::logic_error("invalid label name: " + l);
  }
  for (auto& e : entries_) {
    if (e->name != name) continue;
    if (e->type != type || e->labels != labels) {
      throw std::logic_error("metric " + name + " registered twice with different shapes");
    }
    return *e;
  }
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->type = type;
  e->labels = labels;
  entries_.push_back(std::move(e));
  return *entries_.back();
}

template <class Metric>
Family<Metric>& Registry::Make(const std::string& name, const std::string& help, const char* type,
                               const std::vector<std::string>& labels) {
  std::lock_guard lock(mutex_);
  auto& e = Add(name, help, type, labels);
  if (std::holds_alternative<std::monostate>(e.data)) {
    e.data = std::make_unique<Family<Metric>>(labels, [] { return std::make_unique<Metric>(); });
  }
  auto* family = std::get_if<std::unique_ptr<Family<Metric>>>(&e.data);
  if (family == nullptr) throw std::logic_error("metric " + name + " is read from a function");
  return **family;
}

Family<Counter>& Registry::Counter(const std::string& name, const std::string& help,
                                   const std::vector<std::string>& labels) {
  return Make<metrics::Counter>(name, help, "counter", labels);
}

Family<Gauge>& Registry::Gauge(const std::string& name, const std::string& help,
                               const std::vector<std::string>& labels) {
  return Make<metrics::Gauge>(name, help, "gauge", labels);
}

Family<Histogram>& Registry::Histogram(const std::string& name, const std::string& help,
                                       const std::vector<std::string>& labels,
                                       std::vector<double> bounds) {
  if (!std::is_sorted(bounds.begin(), bounds.end())) {
    throw std::logic_error("histogram bounds must ascend: " + name);
  }
  std::lock_guard lock(mutex_);
  auto& e = Add(name, help, "histogram", labels);
  if (std::holds_alternative<std::monostate>(e.data)) {
    e.bounds = bounds;
    e.data = std::make_unique<Family<metrics::Histogram>>(
        labels, [bounds] { return std::make_unique<metrics::Histogram>(bounds); });
  }
  if (e.bounds != bounds) throw std::logic_error("histogram " + name + " has other bounds");
  return *std::get<std::unique_ptr<Family<metrics::Histogram>>>(e.data);
}

void Registry::CounterFrom(const std::string& name, const std::string& help,
                           std::function<double()> read) {
  std::lock_guard lock(mutex_);
  auto& e = Add(name, help, "counter", {});
  e.data = std::move(read);  // the latest source wins (a service rebuilt in one process)
}

void Registry::GaugeFrom(const std::string& name, const std::string& help,
                         std::function<double()> read) {
  std::lock_guard lock(mutex_);
  auto& e = Add(name, help, "gauge", {});
  e.data = std::move(read);
}

void Registry::OnScrape(std::function<void()> collect) {
  std::lock_guard lock(mutex_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> collectors;
  {
    std::lock_guard lock(mutex_);
    collectors = collectors_;
  }
  for (const auto& collect : collectors) {
    try {
      collect();
    } catch (const std::exception&) {  // its gauges keep their last values
    }
  }
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& e : entries_) {
    out += "# HELP " + e->name + " " + Escape(e->help, false) + "\n# TYPE " + e->name + " " +
           e->type + "\n";
    std::visit(
        [&](const auto& data) {
          using T = std::decay_t<decltype(data)>;
          if constexpr (std::is_same_v<T, std::function<double()>>) {
            out += e->name + " " + Number(data()) + "\n";
          } else if constexpr (std::is_same_v<T, std::unique_ptr<Family<metrics::Histogram>>>) {
            for (const auto& [values, h] : data->Series()) {
              auto snap = h->Read();
              for (size_t i = 0; i < snap.cumulative.size(); ++i) {
                std::string le = i < e->bounds.size() ? Number(e->bounds[i]) : "+Inf";
                out += e->name + "_bucket" + Labels(e->labels, values, "le", le) + " " +
                       std::to_string(snap.cumulative[i]) + "\n";
              }
              out += e->name + "_sum" + Labels(e->labels, values) + " " + Number(snap.sum) + "\n";
              out += e->name + "_count" + Labels(e->labels, values) + " " +
                     std::to_string(snap.count) + "\n";
            }
          } else if constexpr (!std::is_same_v<T, std::monostate>) {
            for (const auto& [values, m] : data->Series()) {
              out += e->name + Labels(e->labels, values) + " " + Number(m->Value()) + "\n";
            }
          }
        },
        e->data);
  }
  return out;
}

}  // namespace idemsaga::common::metrics
