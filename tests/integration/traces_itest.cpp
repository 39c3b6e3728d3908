// Traces of the whole flow: the participants export OTLP/HTTP JSON to the orchestrator's
// intake, which stores them with its own spans; the API returns one tree per order. The page
// test loads /ui/ in headless Chromium.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/crypto.hpp"
#include "common/process.hpp"
#include "demo/service.hpp"
#include "demo/stack.hpp"
#include "orchestrator/orchestrator.hpp"
#include "tests/support/demo_options.hpp"
#include "tests/support/metrics_text.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"
#include "tests/support/wait.hpp"

namespace {

using idemsaga::demo::ParticipantKind;
using idemsaga::demo::ParticipantService;
using idemsaga::orchestrator::Orchestrator;
using test_support::AtPort;
using test_support::Call;
using test_support::kDeclinedOrder;
using test_support::Order;
using test_support::Post;
using test_support::ScratchDatabase;
using test_support::Serving;

class TracesTest : public ::testing::Test {
 protected:
  TracesTest() : orch_db_("orchestrator"), inv_db_("inventory"), pay_db_("payment") {}

  void SetUp() override { Start({}); }

  void Start(idemsaga::common::trace::Exporter::Options exporter) {
    payment_.reset();
    inventory_.reset();
    orch_.reset();
    int inventory_port = idemsaga::common::FreeLoopbackPort(),
        payment_port = idemsaga::common::FreeLoopbackPort();
    auto o = test_support::DemoOrchestratorOptions(
        orch_db_.url(), {{"inventory", "http://127.0.0.1:" + std::to_string(inventory_port)},
                         {"payment", "http://127.0.0.1:" + std::to_string(payment_port)}});
    o.retry = {.max_attempts = 4,
               .initial_backoff = std::chrono::milliseconds(5),
               .max_backoff = std::chrono::milliseconds(20)};
    o.exporter = exporter;
    // Each service holds the others' idle connections; a stop waits that long for them.
    o.limits.keep_alive_timeout_s = 1;
    orch_ = std::make_unique<Serving<Orchestrator>>(o);
    orch_->service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
    orch_->service.store().UpsertTenant("acme", idemsaga::common::Sha256Hex("dev-key-acme"));
    idemsaga::demo::ParticipantOptions p{
        .otlp_endpoint = orch_->Url() + "/v1/traces",
        .otlp_headers = {
            {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}}};
    p.limits.keep_alive_timeout_s = 1;
    inventory_ = std::make_unique<Serving<ParticipantService>>(
        AtPort{inventory_port}, ParticipantKind::kInventory, inv_db_.url(), p);
    payment_ = std::make_unique<Serving<ParticipantService>>(
        AtPort{payment_port}, ParticipantKind::kPayment, pay_db_.url(), p);
    client_ = std::make_unique<httplib::Client>(orch_->Client());
  }

  nlohmann::json Trace(const std::string& key, const std::string& api_key = "dev-key-demo") {
    auto r = client_->Get(("/v1/orders/" + key + "/trace").c_str(),
                          {{"Authorization", "Bearer " + api_key}});
    if (!r || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body);
  }

  ScratchDatabase orch_db_, inv_db_, pay_db_;
  std::unique_ptr<Serving<Orchestrator>> orch_;
  std::unique_ptr<Serving<ParticipantService>> inventory_, payment_;
  std::unique_ptr<httplib::Client> client_;
};

std::vector<nlohmann::json> Named(const nlohmann::json& trace, const std::string& name) {
  std::vector<nlohmann::json> out;
  for (const auto& s : trace["spans"]) {
    if (s["name"] == name) out.push_back(s);
  }
  return out;
}

std::map<std::string, nlohmann::json> ById(const nlohmann::json& trace) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& s : trace["spans"]) out[s["span_id"]] = s;
  return out;
}

TEST_F(TracesTest, OneOrderIsOneTreeAcrossTheThreeServices) {
  auto r = Post(*client_, "/v1/orders", Order("t-1"));
  ASSERT_EQ(r->status, 201);
  auto trace = Trace("t-1");
  ASSERT_FALSE(trace.is_null());
  EXPECT_TRUE(trace["complete"].get<bool>()) << trace.dump();
  std::string trace_id = nlohmann::json::parse(r->body)["trace_id"];
  EXPECT_EQ(trace["trace_id"], trace_id);
  EXPECT_EQ(r->get_header_value("traceparent").substr(3, 32), trace_id);

  auto by_id = ById(trace);
  std::set<std::string> services;
  int roots = 0;
  for (const auto& s : trace["spans"]) {
    EXPECT_EQ(s["trace_id"], trace_id);
    services.insert(s["service"]);
    if (s["parent_span_id"].is_null()) {
      ++roots;
      EXPECT_EQ(s["name"], "POST /v1/orders");
    } else {
      EXPECT_TRUE(by_id.count(s["parent_span_id"])) << "orphan span " << s.dump();
    }
    EXPECT_EQ(s["attributes"]["tenant"], "demo") << s.dump();
  }
  EXPECT_EQ(roots, 1);
  EXPECT_EQ(services, (std::set<std::string>{"orchestrator", "inventory", "payment"}));
  for (const char* name :
       {"saga place_order", "step inventory", "step payment", "inventory attempt",
        "payment attempt", "POST /v1/reservations", "POST /v1/charges", "business effect"}) {
    EXPECT_FALSE(Named(trace, name).empty()) << name;
  }
  // A participant writes a new key once, in the effect's own statement: no claim before it,
  // and no commit span after it (the effect's span says the key went with it).
  EXPECT_TRUE(Named(trace, "guard claim").empty());
  EXPECT_TRUE(Named(trace, "guard commit").empty());
  for (const auto& effect : Named(trace, "business effect")) {
    EXPECT_EQ(effect["attributes"]["in_statement"], true) << effect.dump();
  }
  // A participant's request span hangs under the step attempt that called it.
  auto charge = Named(trace, "POST /v1/charges").at(0);
  auto attempt = by_id[charge["parent_span_id"]];
  EXPECT_EQ(attempt["name"], "payment attempt");
  EXPECT_EQ(attempt["attributes"]["derived_key"], "t-1-payment");
  EXPECT_EQ(attempt["attributes"]["attempt"], 1);
  EXPECT_EQ(attempt["attributes"]["outcome"], "succeeded");
  EXPECT_EQ(attempt["attributes"]["http.status_code"], 201);
  EXPECT_EQ(charge["attributes"]["guard.outcome"], "applied");
  EXPECT_EQ(Named(trace, "business effect").size(), 2u);
}

TEST_F(TracesTest, ACallersTraceIsContinued) {
  const std::string caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  auto call = Order("t-2");
  call.extra = {{"traceparent", "00-" + caller_trace + "-00f067aa0ba902b7-01"}};
  auto r = Post(*client_, "/v1/orders", call);
  ASSERT_EQ(r->status, 201);
  EXPECT_EQ(nlohmann::json::parse(r->body)["trace_id"], caller_trace);
  auto trace = Trace("t-2");
  auto root = Named(trace, "POST /v1/orders").at(0);
  EXPECT_EQ(root["parent_span_id"], "00f067aa0ba902b7");
}

TEST_F(TracesTest, ADeclinedOrderShowsMarkedCompensationSpans) {
  ASSERT_EQ(Post(*client_, "/v1/orders", Order("t-3", kDeclinedOrder))->status, 402);
  auto trace = Trace("t-3");
  ASSERT_TRUE(trace["complete"].get<bool>());
  auto by_id = ById(trace);
  auto payment_attempt = Named(trace, "payment attempt").at(0);
  EXPECT_EQ(payment_attempt["status"], "error");
  EXPECT_EQ(payment_attempt["attributes"]["http.status_code"], 402);
  auto compensate = Named(trace, "compensate inventory");
  ASSERT_EQ(compensate.size(), 1u);
  EXPECT_EQ(compensate[0]["attributes"]["compensation"], true);
  EXPECT_EQ(compensate[0]["attributes"]["derived_key"], "t-3-inventory-compensate");
  auto release = Named(trace, "POST /v1/reservations/release").at(0);
  EXPECT_EQ(by_id[release["parent_span_id"]]["name"], "inventory compensation attempt");
  auto undo = Named(trace, "compensation effect").at(0);
  EXPECT_EQ(undo["attributes"]["undo.outcome"], "undone");
  EXPECT_EQ(Named(trace, "saga place_order").at(0)["status"], "error");
  // The refusal is the saga's and the payment's business effect's error; the requests that
  // carried it were served as they should be (common/trace/span_status.hpp).
  auto request = Named(trace, "POST /v1/orders").at(0);
  EXPECT_EQ(request["status"], "ok") << request.dump();
  EXPECT_EQ(request["attributes"]["http.status_code"], 402);
  EXPECT_EQ(Named(trace, "POST /v1/charges").at(0)["status"], "ok");
  auto effects = Named(trace, "business effect");
  EXPECT_EQ(std::count_if(effects.begin(), effects.end(),
                          [](const auto& e) { return e["status"] == "error"; }),
            1);
}

// A 400 is the request itself refused: its span is an error, named by the kind of refusal and
// never by the client's bytes. Nothing is stored for the key, so the span is read from the
// table, by the caller's trace.
TEST_F(TracesTest, ARequestRefusedAsInvalidHasAnErrorSpanNamedByItsKind) {
  const std::string caller_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
  auto call = Order("t-400", R"({"items":"not a list","payment_method":"zzsecretzz"})");
  call.extra = {{"traceparent", "00-" + caller_trace + "-00f067aa0ba902b7-01"}};
  auto r = Post(*client_, "/v1/orders", call);
  ASSERT_EQ(r->status, 400) << r->body;
  auto count = [&](const std::string& where) {
    return orch_db_.Count("SELECT count(*) FROM spans WHERE trace_id = $1 AND " + where,
                          caller_trace);
  };
  ASSERT_TRUE(test_support::WaitFor([&] { return count("true") >= 1; }, std::chrono::seconds(10)));
  EXPECT_EQ(count("name = 'POST /v1/orders' AND status = 'error' AND "
                  "status_message = 'invalid input'"),
            1);
  EXPECT_EQ(count("(spans::text LIKE '%zzsecretzz%' OR spans::text LIKE '%not a list%')"), 0);
  EXPECT_EQ(orch_db_.Count("SELECT count(*) FROM idempotency_keys WHERE idempotency_key = 't-400'"),
            0);
}

TEST_F(TracesTest, ARetriedStepHasOneAttemptSpanPerTryUnderOneStep) {
  payment_->service.faults().Set({.fail_next = 2});
  ASSERT_EQ(Post(*client_, "/v1/orders", Order("t-4"))->status, 201);
  auto trace = Trace("t-4");
  auto step = Named(trace, "step payment");
  ASSERT_EQ(step.size(), 1u);
  auto attempts = Named(trace, "payment attempt");
  ASSERT_EQ(attempts.size(), 3u);
  std::map<long long, std::string> status_by_attempt;
  for (const auto& a : attempts) {
    EXPECT_EQ(a["parent_span_id"], step[0]["span_id"]);
    EXPECT_EQ(a["attributes"]["derived_key"], "t-4-payment");  // the same key every time
    status_by_attempt[a["attributes"]["attempt"]] = a["status"];
  }
  EXPECT_EQ(status_by_attempt,
            (std::map<long long, std::string>{{1, "error"}, {2, "error"}, {3, "ok"}}));
  EXPECT_EQ(step[0]["attributes"]["attempts"], 3);
}

TEST_F(TracesTest, AReplayedRequestShowsInItsOwnRequestSpan) {
  Post(*client_, "/v1/orders", Order("t-5"));
  auto replay = Post(*client_, "/v1/orders", Order("t-5"));
  ASSERT_EQ(replay->get_header_value("Idempotent-Replayed"), "true");
  auto trace = Trace("t-5");
  auto requests = Named(trace, "POST /v1/orders");
  ASSERT_EQ(requests.size(), 2u);
  int replays = 0;
  for (const auto& r : requests) {
    if (r["attributes"].value("replayed", false)) {
      ++replays;
      EXPECT_EQ(r["attributes"]["idempotency.outcome"], "replayed");
    }
  }
  EXPECT_EQ(replays, 1);
  EXPECT_EQ(Named(trace, "saga place_order").size(), 1u);  // nothing ran again
}

// A client resending one finished key as fast as it can gets every answer, byte for byte, and
// every replay is counted; but only one replay a second is traced and logged, each counting
// the replays answered since: the storm writes a span row a second, not one a request.
TEST_F(TracesTest, AKeysRetryStormIsTracedOnceASecondAndEveryReplayIsCounted) {
  auto first = Post(*client_, "/v1/orders", Order("t-storm"));
  ASSERT_EQ(first->status, 201);
  const std::string trace_id = nlohmann::json::parse(first->body)["trace_id"];
  auto replayed = [&] {
    return test_support::Sample(client_->Get("/metrics")->body,
                                R"(idemsaga_idempotency_requests_total{outcome="replayed"})");
  };
  const double replayed_before = replayed();
  constexpr int kStorm = 200;
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < kStorm; ++i) {
    auto r = Post(*client_, "/v1/orders", Order("t-storm"));
    ASSERT_EQ(r->status, 201) << i;
    ASSERT_EQ(r->body, first->body) << i;
    ASSERT_EQ(r->get_header_value("Idempotent-Replayed"), "true") << i;
    ASSERT_EQ(r->get_header_value("traceparent").substr(3, 32), trace_id) << i;
  }
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started);
  // One more after a quiet second: traced, it counts the storm's untraced rest.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_EQ(Post(*client_, "/v1/orders", Order("t-storm"))->body, first->body);
  EXPECT_EQ(replayed() - replayed_before, kStorm + 1);

  int traced = 0;
  long long untraced = 0;
  ASSERT_TRUE(test_support::WaitFor(
      [&] {
        traced = 0;
        untraced = 0;
        auto trace = Trace("t-storm");
        if (trace.is_null()) return false;
        for (const auto& r : Named(trace, "POST /v1/orders")) {
          if (!r["attributes"].value("replayed", false)) continue;
          ++traced;
          untraced += r["attributes"].value("replays.untraced_before", 0LL);
        }
        return traced + untraced == kStorm + 1;
      },
      std::chrono::seconds(10)))
      << traced << " traced + " << untraced << " untraced";
  // The first replay is traced (it filled the cache), then one a second, and the last.
  EXPECT_GE(traced, 2);
  EXPECT_LE(traced, 3 + static_cast<int>(seconds.count()));
}

// A caller that sends its own traceparent gets its own trace back on every replay of a storm,
// sampled or not, as a traced replay answers it.
TEST_F(TracesTest, AStormWithTheCallersTraceAnswersTheCallersTraceEveryTime) {
  ASSERT_EQ(Post(*client_, "/v1/orders", Order("t-storm-caller"))->status, 201);
  const std::string caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  auto call = Order("t-storm-caller");
  call.extra.emplace("traceparent", "00-" + caller_trace + "-00f067aa0ba902b7-01");
  for (int i = 0; i < 30; ++i) {
    auto r = Post(*client_, "/v1/orders", call);
    ASSERT_EQ(r->status, 201) << i;
    ASSERT_EQ(r->get_header_value("Idempotent-Replayed"), "true") << i;
    ASSERT_EQ(r->get_header_value("traceparent").substr(3, 32), caller_trace) << i;
  }
}

TEST_F(TracesTest, AnotherTenantCannotReadTheTrace) {
  Post(*client_, "/v1/orders", Order("t-6"));
  EXPECT_TRUE(Trace("t-6", "dev-key-acme").is_null());
  auto r = client_->Get("/v1/orders/t-6/trace", {{"Authorization", "Bearer dev-key-acme"}});
  EXPECT_EQ(r->status, 404);
}

TEST_F(TracesTest, TheIntakeWantsTheServiceTokenAndOtlp) {
  EXPECT_EQ(client_->Post("/v1/traces", R"({"resourceSpans":[]})", "application/json")->status,
            401);
  httplib::Headers auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}};
  EXPECT_EQ(client_->Post("/v1/traces", auth, R"({"spans":[]})", "application/json")->status, 400);
  EXPECT_EQ(
      client_->Post("/v1/traces", auth, R"({"resourceSpans":[]})", "application/json")->status,
      200);
}

// One bad span never loses the good ones: the intake keeps them and names what it refused
// (OTLP partial success); a batch of only bad spans is a 400 naming the field. Never a 5xx.
TEST_F(TracesTest, TheIntakeKeepsGoodSpansAndNamesTheRefusedOnes) {
  httplib::Headers auth = {
      {"Authorization", std::string("Bearer ") + idemsaga::demo::kServiceToken}};
  auto span = [](const std::string& id, const std::string& name) {
    return nlohmann::json{{"traceId", std::string(31, 'a') + "1"},
                          {"spanId", id},
                          {"name", name},
                          {"startTimeUnixNano", "1"},
                          {"endTimeUnixNano", "2"}};
  };
  auto batch = [](std::vector<nlohmann::json> spans) {
    return nlohmann::json{{"resourceSpans", {{{"scopeSpans", {{{"spans", spans}}}}}}}}.dump();
  };
  auto mixed = client_->Post(
      "/v1/traces", auth,
      batch({span(std::string(16, '1'), "good"), span(std::string(16, '2'), std::string("n\0l", 3)),
             span(std::string(16, '3'), "good too")}),
      "application/json");
  ASSERT_EQ(mixed->status, 200) << mixed->body;
  auto partial = nlohmann::json::parse(mixed->body)["partialSuccess"];
  EXPECT_EQ(partial["rejectedSpans"], "1");
  EXPECT_NE(partial["errorMessage"].get<std::string>().find("spans[1].name"), std::string::npos);
  EXPECT_EQ(
      orch_db_.Count("SELECT count(*) FROM spans WHERE trace_id = $1", std::string(31, 'a') + "1"),
      2);

  auto only_bad =
      client_->Post("/v1/traces", auth, batch({span("zz", "bad id")}), "application/json");
  EXPECT_EQ(only_bad->status, 400);
  EXPECT_NE(only_bad->body.find("spanId"), std::string::npos) << only_bad->body;
  for (const char* body : {R"({"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":5}]}]}]})",
                           R"({"resourceSpans":[7]})", R"({"resourceSpans":[{"resource":3}]})",
                           R"({"resourceSpans":[{"scopeSpans":{"spans":1}}]})"}) {
    auto r = client_->Post("/v1/traces", auth, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_LT(r->status, 500) << body << " -> " << r->body;
  }
}

// The exporter sends a collector exactly the headers configured for it: never the service
// token that authorises charges, refunds and fault injection.
TEST_F(TracesTest, AnExternalCollectorGetsOnlyItsConfiguredHeadersNeverTheServiceToken) {
  std::mutex mutex;
  std::vector<std::map<std::string, std::string>> received;
  Serving<idemsaga::common::http::Server> collector;
  collector.service.Post("/v1/traces", [&](const httplib::Request& req, httplib::Response& res) {
    std::lock_guard lock(mutex);
    std::map<std::string, std::string> headers;
    for (const auto& [k, v] : req.headers) headers[k] = v;
    received.push_back(headers);
    res.set_content("{}", "application/json");
  });
  // Nothing listens at the participants: spans all the same.
  auto o = test_support::DemoOrchestratorOptions(
      orch_db_.url(), {{"inventory", "http://127.0.0.1:1"}, {"payment", "http://127.0.0.1:1"}});
  o.service_token = "secret-service-token";
  o.otlp_endpoint = collector.Url() + "/v1/traces";
  o.otlp_headers = {{"X-Collector-Key", "ck-1"}};
  o.sagas.response_budget = std::chrono::milliseconds(100);
  {
    Serving<Orchestrator> exporting(o);
    exporting.service.store().UpsertTenant("demo", idemsaga::common::Sha256Hex("dev-key-demo"));
    auto c = exporting.Client();
    Post(c, "/v1/orders", Order("export-1"));
    exporting.service.exporter().Flush();
  }
  std::lock_guard lock(mutex);
  ASSERT_FALSE(received.empty());
  for (const auto& headers : received) {
    EXPECT_EQ(headers.count("Authorization"), 0u);
    for (const auto& [k, v] : headers) {
      EXPECT_EQ(v.find("secret-service-token"), std::string::npos) << k;
    }
    EXPECT_EQ(headers.at("X-Collector-Key"), "ck-1");
  }
}

TEST_F(TracesTest, AFullExportQueueDropsSpansAndRequestsStillSucceed) {
  Start({.max_queue = 2,
         .max_batch = 1,
         .flush_interval = std::chrono::hours(1),
         .tick = std::chrono::hours(1)});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Post(*client_, "/v1/orders", Order("q-" + std::to_string(i)))->status, 201);
  }
  EXPECT_GT(orch_->service.exporter().dropped(), 0);
}

// The trace page in a real browser: every span drawn, the compensation marked.
TEST_F(TracesTest, ThePageDrawsTheWholeWaterfallOfADeclinedOrder) {
  std::string chromium;
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (std::filesystem::exists(c)) chromium = c;
  }
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/test installs it)";
  ASSERT_EQ(Post(*client_, "/v1/orders", Order("page-1", kDeclinedOrder))->status, 402);
  auto trace = Trace("page-1");
  ASSERT_TRUE(trace["complete"].get<bool>());
  size_t spans = trace["spans"].size();

  std::string profile = std::filesystem::temp_directory_path() /
                        ("idemsaga-chromium-" + idemsaga::common::RandomHex(4));
  std::string url = orch_->Url() + "/ui/#key=dev-key-demo&order=page-1";
  std::vector<std::string> flags = {chromium,
                                    "--headless",
                                    "--no-sandbox",
                                    "--disable-gpu",
                                    "--disable-background-networking",
                                    "--no-first-run",
                                    "--disable-component-update",
                                    "--disable-sync",
                                    "--user-data-dir=" + profile,
                                    "--window-size=1400,900",
                                    "--virtual-time-budget=5000"};
  auto dom_args = flags;
  dom_args.push_back("--dump-dom");
  dom_args.push_back(url);
  std::string dom = idemsaga::common::ReadProgramOutput(dom_args);
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = dom.find(needle); at != std::string::npos; at = dom.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_NE(dom.find("data-loaded=\"page-1\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_EQ(count("class=\"span-row"), spans);
  EXPECT_EQ(count("class=\"span-row compensation"), 3u);  // step, attempt, participant's undo
  EXPECT_GE(count("class=\"span-row error"), 2u);         // the declined payment
  EXPECT_NE(dom.find("svc-inventory"), std::string::npos);
  EXPECT_NE(dom.find("svc-payment"), std::string::npos);

  // A screenshot for people to look at: build/<preset>/test-artifacts/trace-page.png.
  std::filesystem::create_directories("test-artifacts");
  auto shot_args = flags;
  shot_args.push_back("--screenshot=" +
                      (std::filesystem::current_path() / "test-artifacts/trace-page.png").string());
  shot_args.push_back(url);
  EXPECT_EQ(idemsaga::common::RunProgram(shot_args, profile + ".log"), 0);
  EXPECT_TRUE(std::filesystem::exists("test-artifacts/trace-page.png"));
  std::filesystem::remove_all(profile);
  std::filesystem::remove(profile + ".log");
}

}  // namespace
