// Prometheus metrics: counters, gauges and histograms in families with fixed label names,
// rendered in the text exposition format (0.0.4) that `promtool check metrics` accepts.
// Label values come from code (an outcome, a saga or step name), never from a request: a key
// or a tenant id as a label would grow without bound.
//
// Thread-safe. A family and its series live as long as the Registry; the references handed
// out stay valid, so a hot path looks its series up once and then only increments.
//   common::metrics::Registry metrics;
//   auto& requests = metrics.Counter("idemsaga_guard_requests_total", "...", {"outcome"});
//   requests.With({"applied"}).Inc();
//   metrics.CounterFrom("idemsaga_spans_dropped_total", "...", [&] { return exporter.dropped(); });
//   res.set_content(metrics.Render(), common::metrics::kContentType);
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace idemsaga::common::metrics {

inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void Inc(double by = 1);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double by);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double v);
  // Cumulative counts per bound (the last is +Inf), the sum and the count, read together.
  struct Snapshot {
    std::vector<unsigned long long> cumulative;
    double sum = 0;
    unsigned long long count = 0;
  };
  Snapshot Read() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<unsigned long long> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  unsigned long long count_ = 0;
};

// Seconds, from a millisecond to two minutes: a saga's or a request's duration.
std::vector<double> DurationBuckets();

template <class Metric>
class Family {
 public:
  Family(std::vector<std::string> label_names, std::function<std::unique_ptr<Metric>()> make)
      : label_names_(std::move(label_names)), make_(std::move(make)) {}
  // The series with these label values (as many as the family has names), made at first use.
  Metric& With(const LabelValues& values);
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Every series, in label order.
  std::vector<std::pair<LabelValues, const Metric*>> Series() const;

 private:
  std::vector<std::string> label_names_;
  std::function<std::unique_ptr<Metric>()> make_;
  mutable std::mutex mutex_;
  std::map<LabelValues, std::unique_ptr<Metric>> series_;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registering a name twice with the same type and labels returns the first family (two
  // guards in one process share theirs); with another type or labels it throws
  // std::logic_error. Names must match [a-z_:][a-z0-9_:]*.
  Family<metrics::Counter>& Counter(const std::string& name, const std::string& help,
                                    const std::vector<std::string>& labels = {});
  Family<metrics::Gauge>& Gauge(const std::string& name, const std::string& help,
                                const std::vector<std::string>& labels = {});
  Family<metrics::Histogram>& Histogram(const std::string& name, const std::string& help,
                                        const std::vector<std::string>& labels,
                                        std::vector<double> bounds = DurationBuckets());
  // A single value read from `read` at each scrape (a count kept elsewhere, as an atomic).
  void CounterFrom(const std::string& name, const std::string& help, std::function<double()> read);
  void GaugeFrom(const std::string& name, const std::string& help, std::function<double()> read);
  // Runs before each render (e.g. one query that sets several gauges). A collector that
  // throws leaves the gauges it sets as they were.
  void OnScrape(std::function<void()> collect);

  std::string Render() const;

 private:
  struct Entry;
  template <class Metric>
  Family<Metric>& Make(const std::string& name, const std::string& help, const char* type,
                       const std::vector<std::string>& labels);
  Entry& Add(const std::string& name, const std::string& help, const char* type,
             const std::vector<std::string>& labels);

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<std::function<void()>> collectors_;
};

// A label value escaped for the exposition format (backslash, double quote, newline).
std::string EscapeLabel(const std::string& value);

}  // namespace idemsaga::common::metrics
