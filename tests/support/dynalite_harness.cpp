#include "tests/support/dynalite_harness.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/dynamo/client.hpp"
#include "common/net.hpp"
#include "tests/support/spawn.hpp"

namespace test_support {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Answers(const std::string& url) {
  idemsaga::common::dynamo::Client client({.url = url,
                                           .credentials = {"local", "local", ""},
                                           .connect_timeout = std::chrono::milliseconds(200),
                                           .request_timeout = std::chrono::milliseconds(500)});
  try {
    client.Call("ListTables", nlohmann::json::object());
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Dynalite::Dynalite() {
  port_ = idemsaga::common::FreeLoopbackPort();
  log_ = (std::filesystem::temp_directory_path() /
          ("idemsaga-dynalite-" + std::to_string(port_) + ".log"))
             .string();
  // No waits of its own: tables are ACTIVE at once.
  std::vector<std::string> args = {"bash",
                                   std::string(IDEMSAGA_SOURCE_DIR) + "/scripts/dynalite.sh",
                                   "--host",
                                   "127.0.0.1",
                                   "--port",
                                   std::to_string(port_),
                                   "--createTableMs",
                                   "0",
                                   "--deleteTableMs",
                                   "0",
                                   "--updateTableMs",
                                   "0"};
  // The script execs node: the same PID.
  pid_ = test_support::SpawnTiedChild(std::move(args), log_);
  // The first run installs its packages (scripts/dynalite.sh): allow for it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("dynalite exited at start: " + ReadFile(log_));
    }
    if (Answers(Url())) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Kill();
  throw std::runtime_error("dynalite did not answer within 120 s: " + ReadFile(log_));
}

Dynalite::~Dynalite() {
  Kill();
  std::error_code ec;
  std::filesystem::remove(log_, ec);
}

std::string Dynalite::Url() const { return "http://127.0.0.1:" + std::to_string(port_); }

void Dynalite::Kill() { KillTiedChild(pid_); }

}  // namespace test_support
