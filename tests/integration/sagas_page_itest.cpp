// The sagas page (/ui/sagas) in a real browser (headless Chromium through chromedriver): a
// tenant's sagas with the stuck one first, its last error and attempts, a link to each trace,
// filters by saga and status, and the retry and cancel buttons doing what the API does. A
// screenshot for people: build/<preset>/test-artifacts/sagas-page.png (docs/sagas-page.png).
#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/stack.hpp"
#include "tests/support/wait.hpp"
#include "tests/support/webdriver.hpp"

namespace {

using namespace std::chrono_literals;

class SagasPageTest : public ::testing::Test {
 protected:
  // The rows the page shows: key, class, text, buttons, trace link.
  nlohmann::json Rows(test_support::WebDriver& browser) {
    return browser.Execute(R"js(
      return [...document.querySelectorAll("#rows tr")].map((tr) => ({
        key: tr.dataset.key, stuck: tr.classList.contains("stuck"), text: tr.innerText,
        buttons: [...tr.querySelectorAll("button")].map((b) => b.textContent),
        link: tr.querySelector("a").getAttribute("href")}));)js");
  }
  std::vector<std::string> Keys(const nlohmann::json& rows) {
    std::vector<std::string> keys;
    for (const auto& r : rows) keys.push_back(r["key"]);
    return keys;
  }
  // Sets a filter as a person would and waits for the page to show its result.
  nlohmann::json Filter(test_support::WebDriver& browser, const std::string& id,
                        const std::string& value) {
    browser.Execute("document.body.dataset.loaded = '';");
    browser.Execute(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1];"
        "s.dispatchEvent(new Event('change'));",
        {id, value});
    browser.WaitFor("return document.body.dataset.loaded");
    return Rows(browser);
  }

  test_support::Stack stack_;
  test_support::Serving<idemsaga::orchestrator::Orchestrator>& orch_ = stack_.orch;
  const test_support::ScratchDatabase& orch_db_ = stack_.orch_db;
};

TEST_F(SagasPageTest, ShowsStuckSagasFirstAndItsButtonsRetryAndCancel) {
  auto browser = test_support::WebDriver::Start();
  if (!browser)
    GTEST_SKIP() << "chromium or chromedriver is not installed (scripts/test installs them)";
  auto client = orch_.Client();
  using test_support::Order;
  ASSERT_EQ(Post(client, "/v1/orders", Order("order-ok-1"))->status, 201);
  ASSERT_EQ(
      Post(client, "/v1/orders", Order("order-declined-1", test_support::kDeclinedOrder))->status,
      402);
  ASSERT_EQ(Post(client, "/v1/orders", Order("order-ok-2"))->status, 201);
  ASSERT_EQ(Post(client, "/v1/orders", Order("acme-order-1", test_support::kOrder, "dev-key-acme"))
                ->status,
            201);
  // A running saga and one whose compensation is stuck, as the runner records them.
  test_support::SeedSaga(
      orch_db_,
      {.key = "ship-running-1",
       .saga = "ship_order",
       .steps =
           R"([{"name":"inventory","action_key":"ship-running-1-inventory","status":"succeeded",
                     "attempts":1,"compensation_attempts":0},
                    {"name":"payment","action_key":"ship-running-1-payment","status":"not_run",
                     "attempts":2,"compensation_attempts":0,
                     "detail":"HTTP 503: payment is unavailable, retrying"}])",
       .created_seconds_ago = 120});
  test_support::SeedSaga(
      orch_db_,
      {.key = "order-stuck-1",
       .status = "compensating",
       .stuck = true,
       .steps =
           R"([{"name":"inventory","action_key":"order-stuck-1-inventory","status":"compensating",
                     "attempts":1,"compensation_attempts":7,
                     "detail":"release answered HTTP 500: reservation store offline"},
                    {"name":"payment","action_key":"order-stuck-1-payment","status":"failed",
                     "attempts":1,"compensation_attempts":0,"detail":"card_declined"}])",
       .failed_step = "payment",
       .created_seconds_ago = 3600});

  browser->Navigate(orch_.Url() + "/ui/sagas#key=dev-key-demo");
  ASSERT_EQ(browser->WaitFor("return document.body.dataset.loaded"), "5");
  auto rows = Rows(*browser);
  // The stuck one first though it is the oldest; then newest first; never another tenant's.
  EXPECT_EQ(Keys(rows), (std::vector<std::string>{"order-stuck-1", "order-ok-2", "order-declined-1",
                                                  "order-ok-1", "ship-running-1"}))
      << rows.dump(1);
  const auto& stuck = rows[0];
  EXPECT_TRUE(stuck["stuck"].get<bool>());
  std::string text = stuck["text"];
  EXPECT_NE(text.find("inventory (undo): release answered HTTP 500: reservation store offline"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("7 attempts"), std::string::npos) << text;
  EXPECT_EQ(stuck["buttons"], nlohmann::json::array({"Retry"}));
  EXPECT_EQ(stuck["link"], "/ui/#order=order-stuck-1");
  EXPECT_EQ(rows[4]["buttons"], nlohmann::json::array({"Cancel"}));  // running, not stuck
  EXPECT_NE(rows[2]["text"].get<std::string>().find("payment: "), std::string::npos)
      << rows[2]["text"];  // the declined order's last error
  for (int i : {1, 2, 3}) EXPECT_EQ(rows[i]["buttons"], nlohmann::json::array()) << i;

  std::filesystem::create_directories("test-artifacts");
  std::ofstream("test-artifacts/sagas-page.png", std::ios::binary) << browser->Screenshot();

  // Filters: by saga (the stuck one stays on top only when it matches), by status.
  EXPECT_EQ(Keys(Filter(*browser, "saga", "ship_order")),
            std::vector<std::string>{"ship-running-1"});
  Filter(*browser, "saga", "");
  EXPECT_EQ(Keys(Filter(*browser, "status", "completed")),
            (std::vector<std::string>{"order-ok-2", "order-ok-1"}));
  Filter(*browser, "status", "");

  // Cancel: the person names themselves and answers the prompt with the reason.
  browser->Type("#operator", "alice");
  browser->Click("tr[data-key='ship-running-1'] button.cancel");
  browser->AnswerPrompt("customer called to cancel");
  ASSERT_TRUE(browser->WaitFor(
      "return document.getElementById('msg').textContent.includes('cancel requested')"))
      << browser->Execute("return document.getElementById('msg').textContent");
  EXPECT_EQ(orch_db_.Text("SELECT cancel_requested->>'operator' || ' / ' || "
                          "(cancel_requested->>'reason') FROM idempotency_keys "
                          "WHERE idempotency_key = 'ship-running-1'"),
            "alice / customer called to cancel");
  EXPECT_TRUE(
      browser->WaitFor("return [...document.querySelectorAll(\"tr[data-key='ship-running-1'] td\")]"
                       ".some((td) => td.textContent === 'cancel requested by alice')"));

  // Retry: the stuck saga's lease is given up now and recovery here takes it over.
  long long epoch = orch_db_.Count(
      "SELECT lease_epoch FROM idempotency_keys WHERE idempotency_key = 'order-stuck-1'");
  browser->Click("tr[data-key='order-stuck-1'] button.retry");
  ASSERT_TRUE(browser->WaitFor(
      "return document.getElementById('msg').textContent.includes('retry requested')"))
      << browser->Execute("return document.getElementById('msg').textContent");
  // Recovery may hold the row at this instant; the retry's takeover shows within moments.
  EXPECT_TRUE(test_support::WaitFor(
      [&] {
        return orch_db_.Count(
                   "SELECT lease_epoch FROM idempotency_keys "
                   "WHERE idempotency_key = 'order-stuck-1'") > epoch;
      },
      10s));
}

TEST_F(SagasPageTest, AWrongKeySaysSoAndShowsNothing) {
  auto browser = test_support::WebDriver::Start();
  if (!browser) GTEST_SKIP() << "chromium or chromedriver is not installed";
  auto client = orch_.Client();
  ASSERT_EQ(Post(client, "/v1/orders", test_support::Order("order-ok-1"))->status, 201);
  browser->Navigate(orch_.Url() + "/ui/sagas#key=not-a-key");
  auto msg = browser->WaitFor("return document.getElementById('msg').textContent");
  EXPECT_NE(msg.get<std::string>().find("API key"), std::string::npos) << msg;
  EXPECT_EQ(Rows(*browser), nlohmann::json::array());
}

}  // namespace
