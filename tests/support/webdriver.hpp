// A browser a test can click: Debian's chromedriver (package chromium-driver, installed by
// scripts/test) on a free loopback port, driving headless Chromium over the W3C WebDriver
// protocol (plain JSON over HTTP, so no client library). Ends the chromedriver it started, by
// its PID.
//   auto browser = test_support::WebDriver::Start();   // nullopt when not installed
//   browser->Navigate(url); browser->Execute("return document.title");
#pragma once

#include <fcntl.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/net.hpp"

extern char** environ;

namespace test_support {

class WebDriver {
 public:
  // nullopt when chromium or chromedriver is missing; throws when they do not start.
  static std::unique_ptr<WebDriver> Start(int width = 1400, int height = 800) {
    for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromedriver"}) {
      if (!std::filesystem::exists(p)) return nullptr;
    }
    return std::unique_ptr<WebDriver>(new WebDriver(width, height));
  }
  ~WebDriver() {
    if (!session_.empty()) client_->Delete(("/session/" + session_).c_str());
    EndDriver();
  }
  WebDriver(const WebDriver&) = delete;
  WebDriver& operator=(const WebDriver&) = delete;

  void Navigate(const std::string& url) { Command("POST", "/url", {{"url", url}}); }
  // Runs `script` (a function body: `return ...`) in the page; its value.
  nlohmann::json Execute(const std::string& script, nlohmann::json args = nlohmann::json::array()) {
    return Command("POST", "/execute/sync", {{"script", script}, {"args", std::move(args)}});
  }
  // Polls `script` until it returns something truthy; that value, or null after `timeout`.
  nlohmann::json WaitFor(const std::string& script,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto v = Execute(script);
      bool truthy = !v.is_null() && v != false && v != "" && v != 0;
      if (truthy || std::chrono::steady_clock::now() > deadline) return truthy ? v : nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // A real click (the browser's pointer events) on the element `css` selects.
  void Click(const std::string& css) { Command("POST", "/element/" + Find(css) + "/click"); }
  void Type(const std::string& css, const std::string& text) {
    Command("POST", "/element/" + Find(css) + "/value", {{"text", text}});
  }
  // The open window.prompt(): answers `text` and accepts it.
  void AnswerPrompt(const std::string& text) {
    Command("POST", "/alert/text", {{"text", text}});
    Command("POST", "/alert/accept", nlohmann::json::object());
  }
  // The viewport as PNG bytes.
  std::string Screenshot() {
    return Base64Decode(Command("GET", "/screenshot").get<std::string>());
  }

 private:
  WebDriver(int width, int height) {
    port_ = idemsaga::common::FreeLoopbackPort();
    std::string port_flag = "--port=" + std::to_string(port_);
    std::vector<char*> argv = {const_cast<char*>("/usr/bin/chromedriver"), port_flag.data(),
                               const_cast<char*>("--silent"), nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    // A process group of its own: ending it ends the Chromium it started too, even when the
    // session could not be deleted.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    int rc = posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("cannot start chromedriver");
    try {
      Connect(width, height);
    } catch (...) {
      EndDriver();  // no destructor runs for a constructor that throws
      throw;
    }
  }

  void Connect(int width, int height) {
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(60);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!client_->Get("/status")) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("chromedriver did not answer");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // The flags of the trace page's test (machine notes: a closed network refuses Chromium's
    // background connections), a fresh profile each time.
    nlohmann::json options = {
        {"binary", "/usr/bin/chromium"},
        {"args",
         {"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-dev-shm-usage",
          "--window-size=" + std::to_string(width) + "," + std::to_string(height)}}};
    auto r = Send("POST", "/session",
                  {{"capabilities",
                    {{"alwaysMatch",
                      {{"browserName", "chrome"},
                       {"unhandledPromptBehavior", "ignore"},
                       {"goog:chromeOptions", options}}}}}});
    session_ = r.at("sessionId").get<std::string>();
  }

  void EndDriver() {
    kill(-pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {  // 5 s, then for good
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  std::string Find(const std::string& css) {
    auto e = Command("POST", "/element", {{"using", "css selector"}, {"value", css}});
    return e.begin().value().get<std::string>();  // {"element-6066-...": "<id>"}
  }
  nlohmann::json Command(const std::string& method, const std::string& path,
                         const nlohmann::json& body = nullptr) {
    return Send(method, "/session/" + session_ + path, body).at("value");
  }
  nlohmann::json Send(const std::string& method, const std::string& path,
                      const nlohmann::json& body) {
    auto r = method == "GET" ? client_->Get(path.c_str())
                             : client_->Post(path.c_str(), body.is_null() ? "{}" : body.dump(),
                                             "application/json");
    if (!r) throw std::runtime_error("webdriver: no answer to " + method + " " + path);
    auto j = nlohmann::json::parse(r->body, nullptr, false);
    if (r->status != 200 || j.is_discarded()) {
      throw std::runtime_error("webdriver: " + method + " " + path + " -> " +
                               std::to_string(r->status) + " " + r->body.substr(0, 500));
    }
    return path == "/session" ? j.at("value") : j;
  }
  static std::string Base64Decode(const std::string& in) {
    std::string out(in.size() / 4 * 3, '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(in.data()),
                            static_cast<int>(in.size()));
    if (n < 0) throw std::runtime_error("webdriver: a screenshot that is not base64");
    out.resize(static_cast<size_t>(n) - (in.size() - in.find_last_not_of('=') - 1));  // padding
    return out;
  }

  pid_t pid_ = -1;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
  std::string session_;
};

}  // namespace test_support
