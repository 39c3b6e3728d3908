// Load generator for the benchmark: sends N requests with unique Idempotency-Keys from C
// client threads (each with its own kept-alive connection), and prints one JSON line of
// throughput, latency percentiles and status counts.
//
//   loadgen --url http://127.0.0.1:8080 --path /v1/orders --api-key dev-key-demo -n 2000 -c 16
//   loadgen --url http://127.0.0.1:8082 --path /v1/charges --service-token dev-service-token ...
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

int main(int argc, char** argv) {
  std::string url, path = "/v1/orders", api_key, service_token, prefix = "bench";
  int n = 1000, concurrency = 16;
  CLI::App app{"idemsaga load generator"};
  app.add_option("--url", url)->required();
  app.add_option("--path", path, "/v1/orders, or /v1/charges for the participant baseline");
  app.add_option("--api-key", api_key, "tenant API key (orders)");
  app.add_option("--service-token", service_token, "service token (participant baseline)");
  app.add_option("--prefix", prefix, "key prefix; keys are <prefix>-<i>");
  app.add_option("-n", n)->check(CLI::Range(1, 10000000));
  app.add_option("-c", concurrency)->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);

  const bool orders = path == "/v1/orders";
  const std::string body =
      orders
          ? R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":1}],"amount_cents":2500,"currency":"USD","payment_method":"pm_card_visa"})"
          : R"({"amount_cents":2500,"currency":"USD","customer_id":"cust_1","payment_method":"pm_card_visa"})";
  std::atomic<int> next{0};
  std::mutex mutex;
  std::vector<double> latencies_ms;
  std::map<int, int> statuses;
  latencies_ms.reserve(n);

  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < concurrency; ++w) {
    workers.emplace_back([&] {
      httplib::Client client(url);
      client.set_keep_alive(true);
      client.set_connection_timeout(3);
      client.set_read_timeout(30);
      httplib::Headers headers;
      if (orders) {
        headers.emplace("Authorization", "Bearer " + api_key);
      } else {
        headers = {{"Authorization", "Bearer " + service_token}, {"X-Tenant-ID", "bench"}};
      }
      std::vector<double> mine;
      std::map<int, int> my_statuses;
      for (int i; (i = next++) < n;) {
        auto h = headers;
        h.emplace("Idempotency-Key", prefix + "-" + std::to_string(i));
        auto t0 = std::chrono::steady_clock::now();
        auto r = client.Post(path.c_str(), h, body, "application/json");
        auto t1 = std::chrono::steady_clock::now();
        mine.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        ++my_statuses[r ? r->status : 0];
      }
      std::lock_guard lock(mutex);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
      for (auto [s, c] : my_statuses) statuses[s] += c;
    });
  }
  for (auto& t : workers) t.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    return latencies_ms[std::min(
        latencies_ms.size() - 1,
        static_cast<size_t>(p * static_cast<double>(latencies_ms.size())))];
  };
  nlohmann::json out = {{"path", path},
                        {"requests", n},
                        {"concurrency", concurrency},
                        {"seconds", seconds},
                        {"per_second", n / seconds},
                        {"p50_ms", pct(0.50)},
                        {"p99_ms", pct(0.99)},
                        {"statuses", nlohmann::json::object()}};
  for (auto [s, c] : statuses) out["statuses"][std::to_string(s)] = c;
  std::cout << out.dump() << std::endl;
  return statuses.size() == 1 && (statuses.begin()->first / 100) == 2 ? 0 : 1;
}
