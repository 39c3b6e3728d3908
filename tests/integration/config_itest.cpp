// Twelve-factor configuration of the real binary: every flag of every command reads an
// environment variable and is in docs/configuration.md's table; a participant configured by
// its environment alone serves, and logs one JSON object per line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/net.hpp"
#include "common/process.hpp"
#include "demo/stack.hpp"
#include "tests/chaos/chaos_harness.hpp"
#include "tests/support/pg_harness.hpp"
#include "tests/support/serving.hpp"

namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::vector<std::vector<std::string>> kCommands = {{},
                                                         {"dev"},
                                                         {"orchestrator"},
                                                         {"inventory"},
                                                         {"payment"},
                                                         {"shipping"},
                                                         {"migrate"},
                                                         {"tenant", "create"},
                                                         {"tenant", "place"},
                                                         {"tenant", "move"},
                                                         {"reconcile"},
                                                         {"order"},
                                                         {"event"},
                                                         {"sagas", "list"},
                                                         {"sagas", "retry"},
                                                         {"sagas", "cancel"},
                                                         {"sagas", "resolve"},
                                                         {"trace"},
                                                         {"orders", "get"}};

TEST(Config, EveryFlagOfEveryCommandReadsAVariableThatTheTableDocuments) {
  std::string docs = Slurp(std::string(IDEMSAGA_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_FALSE(docs.empty());
  const std::regex option(R"(^  (?:-[a-z],)?(--[a-z0-9-]+)(.*)$)");
  const std::regex env(R"(\(Env:(IDEMSAGA_[A-Z0-9_]+)\))");
  std::set<std::string> served;
  int flags = 0;
  for (const auto& command : kCommands) {
    std::vector<std::string> argv = {IDEMSAGA_BINARY};
    argv.insert(argv.end(), command.begin(), command.end());
    argv.push_back("--help");
    std::istringstream help(idemsaga::common::ReadProgramOutput(argv));
    for (std::string line; std::getline(help, line);) {
      std::smatch m, e;
      if (!std::regex_match(line, m, option) || m[1] == "--help") continue;
      ++flags;
      std::string rest = m[2];
      ASSERT_TRUE(std::regex_search(rest, e, env)) << "no variable for " << line;
      served.insert(e[1]);
      EXPECT_NE(docs.find("| `" + e[1].str() + "` | `" + m[1].str() + "` |"), std::string::npos)
          << e[1] << " (" << m[1] << ") is not in docs/configuration.md";
    }
  }
  EXPECT_GT(flags, 40);
  // And the table names nothing the binary does not read.
  std::smatch m;
  const std::regex row(R"(\| `(IDEMSAGA_[A-Z0-9_]+)` \|)");
  for (auto it = std::sregex_iterator(docs.begin(), docs.end(), row); it != std::sregex_iterator();
       ++it) {
    EXPECT_TRUE(served.count((*it)[1])) << (*it)[1] << " is documented but read by no flag";
  }
}

// `idemsaga ... --help` of every command, found by walking the help's own Subcommands lists
// (so a command added later is checked too): every option and positional has a description.
TEST(Config, EveryOptionOfEveryCommandHasADescriptionInItsHelp) {
  std::vector<std::vector<std::string>> queue = {{}};
  int commands = 0, options = 0;
  while (!queue.empty()) {
    auto command = queue.back();
    queue.pop_back();
    ++commands;
    std::vector<std::string> argv = {IDEMSAGA_BINARY};
    argv.insert(argv.end(), command.begin(), command.end());
    argv.push_back("--help");
    std::string name = "idemsaga";
    for (const auto& c : command) name += " " + c;
    std::vector<std::string> lines;
    std::istringstream help(idemsaga::common::ReadProgramOutput(argv));
    for (std::string line; std::getline(help, line);) lines.push_back(line);
    std::string section;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i];
      if (!line.empty() && line[0] != ' ') {
        section = line;
        continue;
      }
      if (line.size() < 3 || line[0] != ' ' || line[1] != ' ' || line[2] == ' ') continue;
      // "  NAME[ TYPE=DEFAULT (Env:X)]" then, after two or more spaces or on the next line
      // (indented, when the left column is full), the description.
      auto left_end = line.find("  ", 2);
      bool described = left_end != std::string::npos &&
                       line.find_first_not_of(' ', left_end) != std::string::npos;
      if (!described && i + 1 < lines.size()) {
        const std::string& next = lines[i + 1];
        auto text = next.find_first_not_of(' ');
        described = text != std::string::npos && text > 4 && next[text] != '-';
      }
      std::string option = line.substr(2, line.find(' ', 2) - 2);
      if (section == "Subcommands:") {
        auto sub = command;
        sub.push_back(option);
        queue.push_back(sub);
        EXPECT_TRUE(described) << name << " " << option << " has no summary";
      } else if (section == "Options:" || section == "Positionals:") {
        ++options;
        EXPECT_TRUE(described) << name << ": " << option << " has no description in --help";
      }
    }
  }
  EXPECT_GE(commands, 15);
  EXPECT_GE(options, 100);
  std::cout << "help: commands=" << commands << " options=" << options << std::endl;
}

TEST(Config, AParticipantConfiguredOnlyByItsEnvironmentServesAndLogsJsonLines) {
  test_support::ScratchDatabase db("inventory");
  int port = idemsaga::common::FreeLoopbackPort();
  std::string log = ::testing::TempDir() + "config_itest_inventory.log";
  std::remove(log.c_str());
  chaos::Process p({IDEMSAGA_BINARY, "inventory"},
                   {{"IDEMSAGA_LISTEN", "127.0.0.1:" + std::to_string(port)},
                    {"IDEMSAGA_INVENTORY_DATABASE_URL", db.url()},
                    {"IDEMSAGA_SERVICE_TOKEN", "token-from-env"},
                    {"IDEMSAGA_LOG_FORMAT", "json"}},
                   log);
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(0, 200000);
  bool ready = false;
  for (int i = 0; i < 200 && !ready; ++i) {
    auto r = c.Get("/readyz");
    ready = r && r->status == 200;
    if (!ready) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(ready) << Slurp(log);
  test_support::Call call{.key = "env-inventory",
                          .body = R"({"items":[{"sku":"widget","quantity":1}]})",
                          .token = "token-from-env"};
  auto r = test_support::Post(c, "/v1/reservations", call);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201) << r->body;
  call.token = idemsaga::demo::kServiceToken;  // the default is not what the environment said
  EXPECT_EQ(test_support::Post(c, "/v1/reservations", call)->status, 401);
  p.Signal(SIGTERM);  // logs its shutdown
  ASSERT_TRUE(p.Exited(10s));
  std::istringstream lines(Slurp(log));
  int json_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("inventory ready on", 0) == 0) continue;  // stdout's one line
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    EXPECT_TRUE(j.contains("ts") && j.contains("event")) << line;
    ++json_lines;
  }
  EXPECT_GT(json_lines, 0) << Slurp(log);
}

}  // namespace

// --amqp-url takes a cluster's nodes, as a list in one value (flag or variable) or the flag
// repeated: one URL that is not amqp:// among them stops the orchestrator before it starts
// anything, with a message that does not echo the URL (credentials).
TEST(Config, AnAmqpUrlListWithOneBadUrlIsRefusedAtStartUpWithoutEchoingIt) {
  const std::string bad = "http://user:s3cret@rabbit2:5672";
  const std::vector<std::vector<std::string>> flags = {
      {"--amqp-url", "amqp://user:s3cret@rabbit1:5672," + bad},
      {"--amqp-url", "amqp://user:s3cret@rabbit1:5672", "--amqp-url", bad},
      {}};
  for (const auto& f : flags) {
    std::vector<std::string> argv = {IDEMSAGA_BINARY,   "orchestrator",
                                     "--database-url",  "postgresql://127.0.0.1:1/none",
                                     "--service-token", "t"};
    argv.insert(argv.end(), f.begin(), f.end());
    std::map<std::string, std::string> env;
    if (f.empty()) env["IDEMSAGA_AMQP_URL"] = "amqp://user:s3cret@rabbit1:5672," + bad;
    std::string log = ::testing::TempDir() + "config_itest_amqp_url.log";
    std::remove(log.c_str());
    chaos::Process p(argv, env, log);
    ASSERT_TRUE(p.Exited(10s));
    std::string printed = Slurp(log);
    EXPECT_NE(printed.find("--amqp-url: expected amqp://"), std::string::npos) << printed;
    EXPECT_EQ(printed.find("s3cret"), std::string::npos) << printed;
    EXPECT_EQ(printed.find("cannot connect to the database"), std::string::npos)
        << "refused before anything started: " << printed;
  }
}
