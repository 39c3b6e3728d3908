// W3C traceparent, OTLP JSON, the exporter's bounded queue and the terminal waterfall.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/trace/exporter.hpp"
#include "common/trace/otlp.hpp"
#include "common/trace/trace_context.hpp"
#include "common/trace/view.hpp"

namespace {

using namespace idemsaga::common::trace;

const std::string kTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
const std::string kSpan = "00f067aa0ba902b7";

TEST(Traceparent, ParsesTheSpecExample) {
  auto tp = ParseTraceparent("00-" + kTrace + "-" + kSpan + "-01");
  ASSERT_TRUE(tp);
  EXPECT_EQ(tp->trace_id, kTrace);
  EXPECT_EQ(tp->parent_id, kSpan);
  EXPECT_TRUE(tp->sampled);
  EXPECT_FALSE(ParseTraceparent("00-" + kTrace + "-" + kSpan + "-00")->sampled);
}

TEST(Traceparent, FormatsWhatItParses) {
  std::string h = FormatTraceparent(kTrace, kSpan);
  EXPECT_EQ(h, "00-" + kTrace + "-" + kSpan + "-01");
  EXPECT_EQ(ParseTraceparent(h)->trace_id, kTrace);
}

TEST(Traceparent, RejectsWhatTheSpecSaysToIgnore) {
  for (const std::string& bad : std::vector<std::string>{
           "ff-" + kTrace + "-" + kSpan + "-01",                    // version ff is invalid
           "00-" + std::string(32, '0') + "-" + kSpan + "-01",      // all-zero trace id
           "00-" + kTrace + "-" + std::string(16, '0') + "-01",     // all-zero parent id
           "00-" + kTrace.substr(1) + "-" + kSpan + "-01",          // short trace id
           "00-" + kTrace + "-" + kSpan + "0-01",                   // long parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + kSpan + "-01",  // upper case
           "00-" + kTrace + "-" + kSpan + "-01-extra",              // version 00 has 4 fields
           "0g-" + kTrace + "-" + kSpan + "-01",                    // version not hex
           "00-" + kTrace + "-" + kSpan + "-zz",                    // flags not hex
           "", "00", "garbage"}) {
    EXPECT_FALSE(ParseTraceparent(bad)) << bad;
  }
}

TEST(Traceparent, AcceptsALaterVersionWithMoreFields) {
  auto tp = ParseTraceparent("01-" + kTrace + "-" + kSpan + "-01-what-ever");
  ASSERT_TRUE(tp);
  EXPECT_EQ(tp->trace_id, kTrace);
}

TEST(Traceparent, NewIdsAreValidAndDistinct) {
  EXPECT_TRUE(IsHexId(NewTraceId(), 32));
  EXPECT_TRUE(IsHexId(NewSpanId(), 16));
  EXPECT_NE(NewTraceId(), NewTraceId());
}

// A new trace id begins with the second it was made in (8 hex digits, as X-Ray's do), so that
// indexes of trace ids take new ones side by side; the other 24 digits are random.
TEST(Traceparent, NewTraceIdsBeginWithTheCurrentSecond) {
  auto now = [] {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  std::set<std::string> tails;
  for (int i = 0; i < 1000; ++i) {
    long long before = now();
    std::string id = NewTraceId();
    long long after = now();
    long long at = std::stoll(id.substr(0, 8), nullptr, 16);
    ASSERT_GE(at, before) << id;
    ASSERT_LE(at, after) << id;
    tails.insert(id.substr(8));
  }
  EXPECT_EQ(tails.size(), 1000u);
}

// Ids come from a generator per thread: threads must not repeat each other's sequences, and
// every hex digit must occur in every position (no stuck bits).
TEST(Traceparent, IdsFromManyThreadsNeverRepeat) {
  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&ids, t] {
      for (int i = 0; i < kEach; ++i) {
        ids[t].push_back(i % 2 == 0 ? NewTraceId() : NewSpanId() + NewSpanId());
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> all;
  std::vector<std::set<char>> digits(32);
  for (const auto& list : ids) {
    for (const auto& id : list) {
      ASSERT_TRUE(IsHexId(id, 32)) << id;
      all.insert(id);
      for (size_t i = 0; i < id.size(); ++i) digits[i].insert(id[i]);
    }
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
  for (const auto& d : digits) EXPECT_EQ(d.size(), 16u);
}

SpanData Sample(std::string service, std::string span_id, std::string parent) {
  SpanData s;
  s.trace_id = kTrace;
  s.span_id = std::move(span_id);
  s.parent_span_id = std::move(parent);
  s.service = std::move(service);
  s.name = "POST /v1/charges";
  s.kind = SpanKind::kServer;
  s.start_unix_nano = 1700000000000000000LL;
  s.end_unix_nano = 1700000000005000000LL;
  s.status = SpanStatus::kError;
  s.status_message = "declined";
  s.attributes = {{"tenant", std::string("demo")}, {"attempt", 3LL}, {"replayed", true}};
  return s;
}

TEST(Otlp, RoundTripsEveryField) {
  std::vector<SpanData> spans = {Sample("payment", kSpan, ""),
                                 Sample("orchestrator", "1111111111111111", kSpan)};
  auto json = nlohmann::json::parse(EncodeOtlp(spans));
  // The OTLP JSON encoding: hex ids, 64-bit integers as strings, one resource per service.
  EXPECT_EQ(json["resourceSpans"].size(), 2u);
  auto first = json["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_TRUE(first["startTimeUnixNano"].is_string());
  std::string error;
  auto decoded = DecodeOtlp(nlohmann::json::parse(json.dump()), error);
  ASSERT_TRUE(decoded) << error;
  ASSERT_EQ(decoded->spans.size(), 2u);
  EXPECT_EQ(decoded->rejected, 0);
  for (const auto& original : spans) {
    auto it = std::find_if(decoded->spans.begin(), decoded->spans.end(),
                           [&](const SpanData& d) { return d.span_id == original.span_id; });
    ASSERT_NE(it, decoded->spans.end());
    EXPECT_EQ(it->trace_id, original.trace_id);
    EXPECT_EQ(it->parent_span_id, original.parent_span_id);
    EXPECT_EQ(it->service, original.service);
    EXPECT_EQ(it->name, original.name);
    EXPECT_EQ(it->kind, original.kind);
    EXPECT_EQ(it->start_unix_nano, original.start_unix_nano);
    EXPECT_EQ(it->end_unix_nano, original.end_unix_nano);
    EXPECT_EQ(it->status, original.status);
    EXPECT_EQ(it->status_message, original.status_message);
    EXPECT_EQ(it->attributes, original.attributes);
  }
}

// Text as our services record it (a participant's message, a caller's key) may hold quotes,
// control characters or bytes that are not UTF-8: the batch must still parse, and every
// well-formed character arrive as it was.
TEST(Otlp, EncodesAnyTextAsJsonThatParses) {
  SpanData s = Sample("payment", kSpan, "");
  s.name = "q\"uote \\ tab\t nl\n ctl\x01 é € 😀";
  s.status_message = std::string("bad \xff\xc0\xaf \xed\xa0\x80 end");
  s.attributes["weird\"key"] = std::string("\x7f\x1f");
  auto json = nlohmann::json::parse(EncodeOtlp({s}));
  std::string error;
  auto decoded = DecodeOtlp(json, error);
  ASSERT_TRUE(decoded) << error;
  ASSERT_EQ(decoded->spans.size(), 1u) << decoded->error;
  EXPECT_EQ(decoded->spans[0].name, s.name);
  EXPECT_EQ(decoded->spans[0].status_message, "bad \uFFFD\uFFFD\uFFFD \uFFFD\uFFFD\uFFFD end");
  EXPECT_EQ(std::get<std::string>(decoded->spans[0].attributes.at("weird\"key")), "\x7f\x1f");
}

// A batch whose body would pass the intake's limit goes in parts that fit, every span once.
TEST(Otlp, SplitsABatchIntoRequestsThatFitTheIntake) {
  std::vector<SpanData> spans;
  for (int i = 0; i < 37; ++i) {
    std::string id = std::to_string(1000000000000000LL + i);
    spans.push_back(Sample(i % 2 ? "payment" : "inventory", id, ""));
    spans.back().status_message = std::string(static_cast<size_t>(100 + 50 * i), 'm');
  }
  const size_t limit = 8000;
  auto bodies = EncodeOtlpFitting(spans, limit);
  EXPECT_GT(bodies.size(), 3u);
  std::multiset<std::string> seen;
  for (const auto& body : bodies) {
    std::string error;
    auto decoded = DecodeOtlp(nlohmann::json::parse(body), error);
    ASSERT_TRUE(decoded) << error;
    EXPECT_TRUE(body.size() <= limit || decoded->spans.size() == 1) << body.size();
    for (const auto& s : decoded->spans) seen.insert(s.span_id);
  }
  ASSERT_EQ(seen.size(), spans.size());
  for (const auto& s : spans) EXPECT_EQ(seen.count(s.span_id), 1u) << s.span_id;
  EXPECT_EQ(EncodeOtlpFitting(spans).size(), 1u) << "far below the real limit: one request";
}

TEST(Otlp, RefusesRequestsThatAreNotOtlp) {
  std::string error;
  for (const char* body :
       {"{}", "[]", "1", R"({"resourceSpans":{}})", R"({"resourceSpans":"x"})"}) {
    EXPECT_FALSE(DecodeOtlp(nlohmann::json::parse(body), error)) << body;
    EXPECT_FALSE(error.empty());
  }
}

// Each bad field refuses its own span, named by path, and never the good spans beside it.
TEST(Otlp, RefusesEachBadSpanByFieldAndKeepsTheGoodOnes) {
  struct Case {
    const char* field;
    nlohmann::json value;  // null removes the field
  };
  std::vector<Case> cases = {
      {"traceId", "xyz"},
      {"traceId", std::string(32, '0')},  // all zero is invalid in W3C
      {"traceId", 7},
      {"traceId", nullptr},
      {"spanId", "ABCDEF0123456789"},
      {"parentSpanId", 12},
      {"name", std::string("nul\0name", 8)},
      {"name", ""},
      {"name", std::string(5000, 'n')},
      {"name", nlohmann::json::array()},
      {"kind", 9},
      {"kind", "server"},
      {"startTimeUnixNano", "12x"},
      {"startTimeUnixNano", "99999999999999999999999"},
      {"startTimeUnixNano", -5},
      {"endTimeUnixNano", "1"},  // before the start
      {"status", "ok"},
      {"status", nlohmann::json::parse(R"({"code":7})")},
      {"status", nlohmann::json::parse(R"({"code":2,"message":"a\u0000b"})")},
      {"attributes", "x"},
      {"attributes", nlohmann::json::parse(R"([{"key":1,"value":{"stringValue":"v"}}])")},
      {"attributes", nlohmann::json::parse(R"([{"key":"k","value":{"stringValue":"\u0000"}}])")},
      {"attributes", nlohmann::json::parse(R"([{"key":"k","value":{"intValue":"1e3"}}])")},
      {"attributes", nlohmann::json::parse(R"([{"key":"k"}])")},
  };
  for (const auto& c : cases) {
    auto request = nlohmann::json::parse(
        EncodeOtlp({Sample("payment", kSpan, ""), Sample("payment", std::string(16, '2'), "")}));
    auto& span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    if (c.value.is_null()) {
      span.erase(c.field);
    } else {
      span[c.field] = c.value;
    }
    std::string error;
    auto decoded = DecodeOtlp(nlohmann::json::parse(request.dump()), error);
    ASSERT_TRUE(decoded) << c.field;
    EXPECT_EQ(decoded->rejected, 1) << c.field << " = " << c.value.dump();
    ASSERT_EQ(decoded->spans.size(), 1u) << c.field;
    EXPECT_EQ(decoded->spans[0].span_id, std::string(16, '2'));
    EXPECT_NE(decoded->error.find(std::string("spans[0].") + c.field), std::string::npos)
        << decoded->error;
  }
}

TEST(Otlp, KeepsTheFullInt64RangeAndSkipsAttributeKindsItDoesNotStore) {
  auto request = nlohmann::json::parse(EncodeOtlp({Sample("payment", kSpan, "")}));
  auto& span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  span["attributes"] = nlohmann::json::parse(
      R"([{"key":"min","value":{"intValue":"-9223372036854775808"}},
          {"key":"list","value":{"arrayValue":{"values":[]}}},
          {"key":"blob","value":{"bytesValue":"AAE="}}])");
  std::string error;
  auto decoded = DecodeOtlp(request, error);
  ASSERT_TRUE(decoded);
  ASSERT_EQ(decoded->spans.size(), 1u) << decoded->error;
  EXPECT_EQ(std::get<long long>(decoded->spans[0].attributes.at("min")),
            std::numeric_limits<long long>::min());
  EXPECT_EQ(decoded->spans[0].attributes.count("list"), 0u);
}

// Thousands of mutated requests: the decoder never throws and never keeps a span whose text
// PostgreSQL could not store.
TEST(Otlp, SurvivesThousandsOfMutatedRequests) {
  std::mt19937 rng(4242);
  auto base = EncodeOtlp(
      {Sample("payment", kSpan, ""), Sample("orchestrator", std::string(16, '3'), kSpan)});
  int decoded_ok = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string body = base;
    for (int m = 0; m < 1 + static_cast<int>(rng() % 4); ++m) {
      size_t at = rng() % body.size();
      switch (rng() % 3) {
        case 0:
          body[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(at, 1 + rng() % 8);
          break;
        default:
          body.insert(at, 1, "\"{}[],:0\\"[rng() % 9]);
          break;
      }
    }
    auto json = nlohmann::json::parse(body, nullptr, false);
    if (json.is_discarded()) continue;  // the route answers 400 invalid_json
    std::string error;
    std::optional<idemsaga::common::trace::DecodedOtlp> decoded;
    ASSERT_NO_THROW(decoded = DecodeOtlp(json, error)) << body;
    if (!decoded) continue;
    ++decoded_ok;
    for (const auto& s : decoded->spans) {
      EXPECT_EQ(s.name.find('\0'), std::string::npos);
      EXPECT_LE(s.start_unix_nano, s.end_unix_nano);
    }
  }
  EXPECT_GT(decoded_ok, 100);
}

TEST(Exporter, AFullQueueDropsAndCountsInsteadOfWaiting) {
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> delivered{0};
  {
    Exporter exporter(
        [&](const std::vector<SpanData>& batch) {
          std::unique_lock lock(m);
          cv.wait(lock, [&] { return release; });  // a collector that hangs
          delivered += static_cast<int>(batch.size());
          return true;
        },
        {.max_queue = 10, .max_batch = 5, .flush_interval = std::chrono::milliseconds(1)});
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 1000; ++i) exporter.Enqueue(Sample("payment", kSpan, ""));
    // 1000 enqueues against a hung sink return at once.
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_GE(exporter.dropped(), 1000 - 10 - 5);
    {
      std::lock_guard lock(m);
      release = true;
    }
    cv.notify_all();
  }
  EXPECT_GT(delivered, 0);
}

TEST(Exporter, DeliversInBatchesAndCountsFailures) {
  std::vector<size_t> sizes;
  Exporter exporter(
      [&](const std::vector<SpanData>& batch) {
        sizes.push_back(batch.size());
        return sizes.size() != 2;  // the second delivery fails
      },
      {.max_queue = 100,
       .max_batch = 4,
       .flush_interval = std::chrono::hours(1),
       .tick = std::chrono::hours(1)});
  for (int i = 0; i < 10; ++i) exporter.Enqueue(Sample("payment", kSpan, ""));
  exporter.Flush();
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 2}));
  EXPECT_EQ(exporter.exported(), 6);
  EXPECT_EQ(exporter.failed(), 4);
}

// A drain delivers what was queued when it began: spans that arrive while it delivers wait for
// the next interval, so a busy service sends one full batch per interval, not a stream of
// small ones.
TEST(Exporter, ADrainDoesNotChaseSpansThatArriveWhileItDelivers) {
  std::vector<size_t> sizes;
  Exporter* self = nullptr;
  Exporter exporter(
      [&](const std::vector<SpanData>& batch) {
        sizes.push_back(batch.size());
        if (sizes.size() == 1) {
          for (int i = 0; i < 3; ++i) self->Enqueue(Sample("payment", kSpan, ""));
        }
        return true;
      },
      {.max_queue = 100,
       .max_batch = 4,
       .flush_interval = std::chrono::hours(1),
       .tick = std::chrono::hours(1)});
  self = &exporter;
  for (int i = 0; i < 6; ++i) exporter.Enqueue(Sample("payment", kSpan, ""));
  exporter.Flush();
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 2}));
  exporter.Flush();
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 2, 3}));
  EXPECT_EQ(exporter.exported(), 9);
}

// Between flush intervals a full batch goes at the next tick, so a busy service's spans are
// delivered as they fill batches rather than half a second's worth at once; the partial batch
// that is left waits for the interval (or a Flush).
TEST(Exporter, AFullBatchGoesAtTheNextTickAndTheRestWaitsForTheInterval) {
  std::mutex m;
  std::vector<size_t> sizes;
  auto delivered = [&] {
    std::lock_guard lock(m);
    return sizes;
  };
  Exporter exporter(
      [&](const std::vector<SpanData>& batch) {
        std::lock_guard lock(m);
        sizes.push_back(batch.size());
        return true;
      },
      {.max_queue = 100,
       .max_batch = 4,
       .flush_interval = std::chrono::hours(1),
       .tick = std::chrono::milliseconds(5)});
  for (int i = 0; i < 10; ++i) exporter.Enqueue(Sample("payment", kSpan, ""));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (delivered().size() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ticks that must send nothing
  EXPECT_EQ(delivered(), (std::vector<size_t>{4, 4}));
  exporter.Flush();
  EXPECT_EQ(delivered(), (std::vector<size_t>{4, 4, 2}));
}

TEST(Waterfall, DrawsTheTreeWithMarkersBarsAndCompensations) {
  nlohmann::json trace = {
      {"trace_id", kTrace},
      {"idempotency_key", "A"},
      {"order_status", "failed"},
      {"complete", true},
      {"spans",
       {{{"span_id", "aaaaaaaaaaaaaaaa"},
         {"parent_span_id", nullptr},
         {"service", "orchestrator"},
         {"name", "POST /v1/orders"},
         {"start_time_unix_nano", 0},
         {"end_time_unix_nano", 100},
         {"status", "error"},
         {"attributes", {{"http.status_code", 402}}}},
        {{"span_id", "bbbbbbbbbbbbbbbb"},
         {"parent_span_id", "aaaaaaaaaaaaaaaa"},
         {"service", "orchestrator"},
         {"name", "compensate inventory"},
         {"start_time_unix_nano", 50},
         {"end_time_unix_nano", 100},
         {"status", "ok"},
         {"attributes", {{"compensation", true}, {"derived_key", "A-inventory-compensate"}}}}}}};
  std::string out = idemsaga::common::trace::RenderWaterfall(trace, 20);
  EXPECT_NE(out.find("POST /v1/orders [402]"), std::string::npos) << out;
  EXPECT_NE(out.find("  \u21a9 compensate inventory [A-inventory-compensate]"), std::string::npos)
      << out;

  EXPECT_NE(out.find("\u2592\u2592\u2592"), std::string::npos) << "compensation bar";
  EXPECT_NE(out.find("ERROR"), std::string::npos);
}

}  // namespace
