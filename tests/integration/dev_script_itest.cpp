// The README's first command, as written: `./scripts/dev` from the checkout, with free ports
// and a folder of its own passed through to `idemsaga dev`. It must print its `ready` line,
// take the README's order (and replay it, also to the README's CLI line), and on SIGINT stop
// everything it started, PostgreSQL included.
//
// The script installs what is missing and builds the release preset before it starts; with
// ccache sharing the test build's objects that is a configure and a link. This process is a
// child subreaper, so the postmaster that pg_ctl detaches stays its descendant: "no child
// left" after the script exits means nothing the script started is left.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/net.hpp"
#include "common/process.hpp"
#include "tests/support/children.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const fs::path kSourceDir = IDEMSAGA_SOURCE_DIR;

// Install check, configure, build and start. From a cold ccache the release build takes
// minutes on a 2-core machine; right after the test build it takes seconds.
constexpr auto kReadyDeadline = std::chrono::minutes(15);
// The services' graceful shutdown (10 s at most with nothing running) and pg_ctl stop -m fast.
constexpr auto kStopDeadline = std::chrono::seconds(60);

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The body of the README's curl example, so that the test follows the README.
std::string ReadmeOrderBody() {
  std::string readme = Slurp(kSourceDir / "README.md");
  size_t at = readme.find("-d '", readme.find("### Try it"));
  if (at == std::string::npos) return "";
  at += 4;
  return readme.substr(at, readme.find('\'', at) - at);
}

// The shell examples of README.md and docs/*.md (```sh and ```bash blocks), to be run as
// written against the running stack: its ports put in for the defaults, `$B` the binary.
struct ShellBlock {
  std::string where;  // file:line
  std::string text;
};
std::vector<ShellBlock> DocShellBlocks() {
  std::vector<fs::path> files = {kSourceDir / "README.md"};
  for (const auto& e : fs::directory_iterator(kSourceDir / "docs")) {
    if (e.path().extension() == ".md") files.push_back(e.path());
  }
  std::sort(files.begin() + 1, files.end());
  std::vector<ShellBlock> out;
  for (const auto& file : files) {
    std::istringstream in(Slurp(file));
    int n = 0;
    std::optional<ShellBlock> open;
    for (std::string line; std::getline(in, line);) {
      ++n;
      if (open) {
        if (line.rfind("```", 0) == 0) {
          out.push_back(*open);
          open.reset();
        } else {
          open->text += line + "\n";
        }
      } else if (line == "```sh" || line == "```bash") {
        open = ShellBlock{fs::relative(file, kSourceDir).string() + ":" + std::to_string(n), ""};
      }
    }
  }
  return out;
}

// Blocks that are not requests to a running stack, and the test that runs each instead.
std::optional<std::string> NotAgainstTheStack(const std::string& text) {
  if (text.rfind("./scripts/", 0) == 0) return "the Quick start: this test and scripts/test";
  if (text.rfind("cmake ", 0) == 0) return "building and installing: install_example_test";
  if (text.rfind("bench/", 0) == 0) return "the benchmark and its peers: run by hand, not a test";
  if (text.rfind("redis-server ", 0) == 0) return "a Redis of the reader's: redis_inventory_itest";
  if (text.find("postgresql://...") != std::string::npos) {
    return "a template for a production database: the chaos suite runs reconcile";
  }
  if (text.find("$DIRECTORY") != std::string::npos) {
    return "a template for cells on several clusters: placement_chaostest runs these commands";
  }
  return std::nullopt;
}

struct ShellCommand {
  std::string text;
  std::vector<std::string> expected;  // the comment lines that show its answer
};

// A block's commands (lines continued by a backslash or inside an open single quote joined),
// each with the comments that follow it.
std::vector<ShellCommand> Commands(const std::string& block) {
  std::vector<ShellCommand> out;
  std::string code;  // the command so far without its trailing comments
  auto without_comment = [](const std::string& line) {
    auto at = line.find("  # ");
    return at == std::string::npos ? line : line.substr(0, at);
  };
  // Whether the shell reads on: a quote still open, or a backslash before the line's end.
  auto continues = [](const std::string& text) {
    char quote = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if (quote == '\'') {
        if (c == '\'') quote = 0;
      } else if (c == '\\') {
        if (i + 1 == text.size()) return true;
        ++i;
      } else if (quote == '"') {
        if (c == '"') quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      }
    }
    return quote != 0;
  };
  auto trailing_comment = [&](const std::string& line) {
    if (auto at = line.find("  # "); at != std::string::npos) {
      out.back().expected.push_back(line.substr(at + 4));
    }
  };
  std::istringstream in(block);
  bool continued = false, after_blank = false;
  for (std::string line; std::getline(in, line);) {
    if (continued) {
      out.back().text += "\n" + line;
      code += "\n" + without_comment(line);
      continued = continues(code);
      if (!continued) trailing_comment(line);
      continue;
    }
    if (line.empty()) {
      after_blank = true;
      continue;
    }
    if (line.rfind("#", 0) == 0) {
      if (!out.empty() && !after_blank) out.back().expected.push_back(line.substr(1));
      continue;
    }
    after_blank = false;
    out.push_back({line, {}});
    code = without_comment(line);
    continued = continues(code);
    if (!continued) trailing_comment(line);
  }
  return out;
}

// The status an example's comment shows: "HTTP/1.1 201 Created", "HTTP 402", "201 {...}".
std::optional<int> ExpectedStatus(const std::vector<std::string>& expected) {
  static const std::regex status(R"(^\s*(?:HTTP/1\.1 |HTTP )?([1-5]\d\d)\b)");
  std::smatch m;
  for (const auto& line : expected) {
    if (std::regex_search(line, m, status)) return std::stoi(m[1]);
  }
  return std::nullopt;
}

bool PortAcceptsConnections(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool open = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return open;
}

using test_support::Child;
using test_support::LiveChildren;

std::vector<Child> ChildrenLeftAfter(Clock::time_point deadline) {
  auto left = LiveChildren();
  while (!left.empty() && Clock::now() < deadline) {
    poll(nullptr, 0, 20);  // the children are exiting: look again shortly
    left = LiveChildren();
  }
  return left;
}

// `./scripts/dev ARGS...` run from the checkout, stdout and stderr on one pipe.
class Script {
 public:
  explicit Script(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"./scripts/dev"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c_argv;
    for (auto& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    std::string cwd = kSourceDir.string();
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, STDIN_FILENO);
      // Should this test die, the stack gets what a Ctrl-C would send and stops.
      prctl(PR_SET_PDEATHSIG, SIGINT);
      if (getppid() != parent) _exit(127);
      if (chdir(cwd.c_str()) != 0) _exit(127);
      execv(c_argv[0], c_argv.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }

  ~Script() {
    if (pid_ > 0) {
      kill(pid_, SIGINT);
      if (!Exited(Clock::now() + kStopDeadline)) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads until a whole line containing `needle` has been printed; returns that line, or ""
  // when the script closed its output or the deadline passed first.
  std::string WaitForLine(const std::string& needle, Clock::time_point deadline) {
    for (;;) {
      size_t at = output_.find(needle);
      size_t eol = at == std::string::npos ? at : output_.find('\n', at);
      if (eol != std::string::npos) {
        size_t bol = output_.rfind('\n', at);
        bol = bol == std::string::npos ? 0 : bol + 1;
        return output_.substr(bol, eol - bol);
      }
      if (!Read(deadline)) return "";
    }
  }

  // Reads to the end of the output and reaps the script; its exit status, or -1 when it
  // did not exit by the deadline or died on a signal.
  int WaitForExit(Clock::time_point deadline) {
    while (Read(deadline)) {
    }
    return Exited(deadline) ? status_ : -1;
  }

 private:
  // One read; false at end of output or at the deadline.
  bool Read(Clock::time_point deadline) {
    if (fd_ < 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    int n = poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) return true;
    char buf[4096];
    ssize_t got = read(fd_, buf, sizeof buf);
    if (got < 0) return errno == EINTR || errno == EAGAIN;
    if (got == 0) {
      close(fd_);
      fd_ = -1;
      return false;
    }
    output_.append(buf, static_cast<size_t>(got));
    return true;
  }

  bool Exited(Clock::time_point deadline) {
    for (;;) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = -1;
        return true;
      }
      if (r < 0 || Clock::now() >= deadline) return false;
      poll(nullptr, 0, 20);  // it is shutting down: look again shortly
    }
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  int status_ = -1;
  std::string output_;
};

class DevScriptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    ASSERT_TRUE(LiveChildren().empty());
    // Not mkdtemp's 0700: the folder must be as reachable as a user's .idemsaga would be, so
    // that a checkout under /root takes the same fallback as `idemsaga dev` does there.
    std::string tmpl = (fs::current_path() / "dev-script-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    work_ = tmpl;
    fs::permissions(work_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                               fs::perms::others_read | fs::perms::others_exec);
    std::set<int> ports;
    while (ports.size() < 5) ports.insert(idemsaga::common::FreeLoopbackPort());
    auto it = ports.begin();
    pg_port_ = *it++;
    orchestrator_port_ = *it++;
    inventory_port_ = *it++;
    payment_port_ = *it++;
    shipping_port_ = *it++;
  }

  void TearDown() override {
    script_.reset();
    if (postmaster_ > 0 && kill(postmaster_, 0) == 0) kill(postmaster_, SIGINT);  // fast stop
    ChildrenLeftAfter(Clock::now() + kStopDeadline);
    if (!cluster_dir_.empty()) fs::remove_all(cluster_dir_);
    fs::remove_all(work_);
  }

  void RunDocShellExamples() {
    const std::vector<std::pair<std::string, int>> ports = {{"127.0.0.1:8080", orchestrator_port_},
                                                            {"127.0.0.1:8081", inventory_port_},
                                                            {"127.0.0.1:8082", payment_port_},
                                                            {"127.0.0.1:8083", shipping_port_}};
    int blocks = 0, commands = 0, checked = 0;  // checked: with the status their comment shows
    for (const auto& block : DocShellBlocks()) {
      if (auto why = NotAgainstTheStack(block.text)) {
        std::cout << "docs example " << block.where << ": not run here (" << *why << ")"
                  << std::endl;
        continue;
      }
      ++blocks;
      std::string text = block.text;
      for (const auto& [from, port] : ports) {
        for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
          text.replace(at, from.size(), "127.0.0.1:" + std::to_string(port));
        }
      }
      auto list = Commands(text);
      std::string script =
          "B=" + (kSourceDir / "build/release/cmd/idemsaga/idemsaga").string() +
          "\nexport IDEMSAGA_URL=http://127.0.0.1:" + std::to_string(orchestrator_port_) +
          "\ncurl() { command curl -sS -w '\\n@@status %{http_code}\\n' \"$@\"; }\n";
      for (const auto& c : list) script += c.text + "\necho \"@@exit $?\"\n";
      fs::path file = work_ / "example.sh", log = work_ / "example.log";
      std::ofstream(file) << script;
      fs::remove(log);
      idemsaga::common::RunProgram({"bash", file.string()}, log.string());
      std::string output = Slurp(log);
      // One part of the output per command, each ending in its exit status.
      size_t from = 0;
      for (const auto& c : list) {
        ++commands;
        size_t end = output.find("@@exit ", from);
        ASSERT_NE(end, std::string::npos) << block.where << ": " << c.text << "\n" << output;
        std::string part = output.substr(from, end - from);
        int exit_code = std::stoi(output.substr(end + 7));
        from = output.find('\n', end) + 1;
        std::smatch m;
        static const std::regex curl_status(R"(@@status (\d{3}))");
        static const std::regex cli_status(R"((?:^|\n)HTTP (\d{3}))");
        std::optional<int> status;
        if (std::regex_search(part, m, curl_status) || std::regex_search(part, m, cli_status)) {
          status = std::stoi(m[1]);
        }
        std::string what = block.where + ": " + c.text + "\n" + part;
        if (auto expected = ExpectedStatus(c.expected)) {
          ++checked;
          EXPECT_EQ(status, expected) << what;
        } else {
          EXPECT_EQ(exit_code, 0) << what;
          if (status) EXPECT_LT(*status, 400) << what;
        }
        // The problem codes the example shows are the ones answered.
        static const std::regex code(R"re("code":"([a-z_]+)")re");
        for (const auto& line : c.expected) {
          for (std::sregex_iterator it(line.begin(), line.end(), code), e; it != e; ++it) {
            EXPECT_NE(part.find("\"" + (*it)[1].str() + "\""), std::string::npos) << what;
          }
        }
      }
    }
    std::cout << "docs examples: blocks=" << blocks << " commands=" << commands
              << " with_status_checked=" << checked << std::endl;
    EXPECT_GE(blocks, 5);
    EXPECT_GE(checked, 8);
  }

  fs::path work_, cluster_dir_;
  int pg_port_ = 0, orchestrator_port_ = 0, inventory_port_ = 0, payment_port_ = 0,
      shipping_port_ = 0;
  pid_t postmaster_ = -1;
  std::unique_ptr<Script> script_;
};

TEST_F(DevScriptTest, TheReadmesFirstCommandServesAnOrderAndCtrlCStopsEverythingItStarted) {
  std::string body = ReadmeOrderBody();
  ASSERT_NE(body.find("\"customer_id\""), std::string::npos) << "no curl body in README.md";

  auto started = Clock::now();
  script_ = std::make_unique<Script>(std::vector<std::string>{
      "--dir", (work_ / "data").string(), "--pg-port", std::to_string(pg_port_),
      "--orchestrator-port", std::to_string(orchestrator_port_), "--inventory-port",
      std::to_string(inventory_port_), "--payment-port", std::to_string(payment_port_),
      "--shipping-port", std::to_string(shipping_port_)});
  std::string pg_line = script_->WaitForLine("starting PostgreSQL in ", started + kReadyDeadline);
  ASSERT_FALSE(pg_line.empty()) << script_->output();
  cluster_dir_ = pg_line.substr(pg_line.find(" in ") + 4);
  ASSERT_FALSE(script_->WaitForLine("idemsaga dev ready", started + kReadyDeadline).empty())
      << script_->output();
  auto ready = Clock::now();

  // The postmaster: started by pg_ctl, detached, and (being a subreaper) now our child.
  std::ifstream pid_file(cluster_dir_ / "data" / "postmaster.pid");
  ASSERT_TRUE(pid_file >> postmaster_) << "no postmaster.pid in " << cluster_dir_;
  EXPECT_EQ(kill(postmaster_, 0), 0);
  bool ours = false;
  for (const auto& child : LiveChildren()) ours = ours || child.pid == postmaster_;
  EXPECT_TRUE(ours) << "the postmaster is not a descendant of this test";
  EXPECT_TRUE(PortAcceptsConnections(pg_port_));

  // The README's curl example, then the same request again.
  httplib::Client client("127.0.0.1", orchestrator_port_);
  client.set_connection_timeout(5);
  client.set_read_timeout(30);
  httplib::Headers headers = {{"Authorization", "Bearer dev-key-demo"},
                              {"Idempotency-Key", "order-1"}};
  auto first = client.Post("/v1/orders", headers, body, "application/json");
  ASSERT_TRUE(first) << httplib::to_string(first.error());
  EXPECT_EQ(first->status, 201) << first->body;
  EXPECT_NE(first->body.find("\"status\":\"completed\""), std::string::npos) << first->body;
  auto again = client.Post("/v1/orders", headers, body, "application/json");
  ASSERT_TRUE(again) << httplib::to_string(again.error());
  EXPECT_EQ(again->status, 201);
  EXPECT_EQ(again->body, first->body);
  EXPECT_EQ(again->get_header_value("Idempotent-Replayed"), "true");
  // The second shipped saga, through the runs API: its three participants all run under dev.
  headers = {{"Authorization", "Bearer dev-key-demo"}, {"Idempotency-Key", "ship-dev-1"}};
  auto shipped = client.Post(
      "/v1/runs/ship_order", headers,
      R"({"customer_id":"cust_1","items":[{"sku":"widget","quantity":2}],"amount_cents":2500,)"
      R"("currency":"USD","payment_method":"pm_card_visa","address":{"name":"Ada Lovelace",)"
      R"("line1":"12 St James's Square","city":"London","postal_code":"SW1Y 4JH","country":"GB"}})",
      "application/json");
  ASSERT_TRUE(shipped) << httplib::to_string(shipped.error());
  EXPECT_EQ(shipped->status, 201) << shipped->body;
  EXPECT_NE(shipped->body.find("\"shipment_id\":\"shp_"), std::string::npos) << shipped->body;
  client.stop();

  // The README's next line, `$B order --api-key dev-key-demo --key order-1`: the CLI's
  // defaults are the curl example's body, so it gets the same order back, replayed.
  fs::path cli_log = work_ / "cli.log";
  int cli_exit = idemsaga::common::RunProgram(
      {(kSourceDir / "build/release/cmd/idemsaga/idemsaga").string(), "order", "--api-key",
       "dev-key-demo", "--key", "order-1", "--url",
       "http://127.0.0.1:" + std::to_string(orchestrator_port_)},
      cli_log.string());
  std::string cli = Slurp(cli_log);
  EXPECT_EQ(cli_exit, 0) << cli;
  EXPECT_NE(cli.find("HTTP 201"), std::string::npos) << cli;
  EXPECT_NE(cli.find("Idempotent-Replayed: true"), std::string::npos) << cli;

  // Every shell example of the README and docs/, as written, on this stack's ports.
  RunDocShellExamples();

  // Ctrl-C.
  auto interrupted = Clock::now();
  ASSERT_EQ(kill(script_->pid(), SIGINT), 0);
  EXPECT_EQ(script_->WaitForExit(interrupted + kStopDeadline), 0) << script_->output();
  auto stopped = Clock::now();
  EXPECT_NE(script_->output().find("\nstopped"), std::string::npos) << script_->output();

  auto left = ChildrenLeftAfter(Clock::now() + std::chrono::seconds(10));
  for (const auto& child : left) {
    ADD_FAILURE() << "left running: " << child.pid << " " << child.comm;
  }
  EXPECT_NE(kill(postmaster_, 0), 0) << "the postmaster " << postmaster_ << " still runs";
  EXPECT_FALSE(fs::exists(cluster_dir_ / "data" / "postmaster.pid"));
  for (int port : {pg_port_, orchestrator_port_, inventory_port_, payment_port_, shipping_port_}) {
    EXPECT_FALSE(PortAcceptsConnections(port)) << "port " << port << " still accepts";
  }

  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  std::cout << "dev_script: ready_ms=" << duration_cast<milliseconds>(ready - started).count()
            << " stop_ms=" << duration_cast<milliseconds>(stopped - interrupted).count()
            << " cluster=" << cluster_dir_.string() << std::endl;
}

}  // namespace
