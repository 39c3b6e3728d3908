// idemsaga::common::metrics: the exposition format as Prometheus reads it (checked by promtool
// itself), and the registry's rules for names, shapes and scrapes.
#include "common/metrics.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/metrics_text.hpp"

namespace {

using idemsaga::common::metrics::Registry;
using test_support::PromtoolProblems;
using test_support::Sample;

TEST(Metrics, EveryKindRendersAsPromtoolAcceptsIt) {
  Registry r;
  r.Counter("demo_requests_total", "Requests by outcome.", {"outcome"}).With({"applied"}).Inc(3);
  r.Gauge("demo_running", "Running now.").With({}).Set(2);
  auto& h = r.Histogram("demo_duration_seconds", "Durations.", {"saga"}, {0.1, 1});
  h.With({"place_order"}).Observe(0.05);
  h.With({"place_order"}).Observe(0.5);
  h.With({"place_order"}).Observe(7);
  r.CounterFrom("demo_dropped_total", "Dropped.", [] { return 4.0; });
  auto page = r.Render();
  EXPECT_EQ(PromtoolProblems(page), "") << page;
  EXPECT_EQ(Sample(page, R"(demo_requests_total{outcome="applied"})"), 3);
  EXPECT_EQ(Sample(page, "demo_running"), 2);
  EXPECT_EQ(Sample(page, R"(demo_duration_seconds_bucket{saga="place_order",le="0.1"})"), 1);
  EXPECT_EQ(Sample(page, R"(demo_duration_seconds_bucket{saga="place_order",le="1"})"), 2);
  EXPECT_EQ(Sample(page, R"(demo_duration_seconds_bucket{saga="place_order",le="+Inf"})"), 3);
  EXPECT_EQ(Sample(page, R"(demo_duration_seconds_count{saga="place_order"})"), 3);
  EXPECT_DOUBLE_EQ(Sample(page, R"(demo_duration_seconds_sum{saga="place_order"})"), 7.55);
  EXPECT_EQ(Sample(page, "demo_dropped_total"), 4);
}

TEST(Metrics, PromtoolRefusesWhatBreaksTheConventions) {
  // The linter the suite relies on does catch a counter without _total.
  EXPECT_NE(PromtoolProblems("# HELP demo_requests Requests.\n# TYPE demo_requests counter\n"
                             "demo_requests 1\n"),
            "");
}

TEST(Metrics, LabelValuesAreEscaped) {
  Registry r;
  r.Counter("demo_total", "Escaping.", {"step"}).With({"a\"b\\c\nd"}).Inc();
  auto page = r.Render();
  EXPECT_NE(page.find(R"(demo_total{step="a\"b\\c\nd"} 1)"), std::string::npos) << page;
  EXPECT_EQ(PromtoolProblems(page), "") << page;
}

TEST(Metrics, RegisteringANameTwiceSharesItsFamilyUnlessTheShapeDiffers) {
  Registry r;
  auto& a = r.Counter("demo_total", "One.", {"service"});
  auto& b = r.Counter("demo_total", "One.", {"service"});
  EXPECT_EQ(&a, &b);
  EXPECT_THROW(r.Counter("demo_total", "One.", {"other"}), std::logic_error);
  EXPECT_THROW(r.Gauge("demo_total", "One.", {"service"}), std::logic_error);
  EXPECT_THROW(r.Counter("Bad-Name", "No."), std::logic_error);
  EXPECT_THROW(r.Counter("demo2_total", "No.", {"le"}), std::logic_error);
  EXPECT_THROW(a.With({"x", "y"}), std::logic_error);
}

TEST(Metrics, ACollectorRunsAtEveryScrapeAndOneThatThrowsKeepsTheLastValues) {
  Registry r;
  auto& g = r.Gauge("demo_stuck", "Stuck.").With({});
  int scrapes = 0;
  r.OnScrape([&] {
    if (++scrapes == 2) throw std::runtime_error("database down");
    g.Set(scrapes * 10);
  });
  EXPECT_EQ(Sample(r.Render(), "demo_stuck"), 10);
  EXPECT_EQ(Sample(r.Render(), "demo_stuck"), 10);
  EXPECT_EQ(Sample(r.Render(), "demo_stuck"), 30);
}

TEST(Metrics, CountersAreExactUnderConcurrentIncrements) {
  Registry r;
  auto& family = r.Counter("demo_total", "Concurrent.", {"t"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) family.With({i % 2 ? "odd" : "even"}).Inc();
    });
  }
  for (auto& t : threads) t.join();
  auto page = r.Render();
  EXPECT_EQ(Sample(page, R"(demo_total{t="odd"})"), 20000);
  EXPECT_EQ(Sample(page, R"(demo_total{t="even"})"), 20000);
}

}  // namespace
