#include <cctype>
#include <string>

#include "app/commands.hpp"
#include "common/log.hpp"
#include "orchestrator/reconcile.hpp"
#include "steps/saga/definition.hpp"

namespace idemsaga::app {

void AddOtlpHeaderOption(CLI::App* cmd, std::vector<std::string>& headers) {
  cmd->add_option("--otlp-header", headers,
                  "\"Name: value\" sent with every span export (repeatable), e.g. the "
                  "collector's credentials; nothing else is sent")
      ->check([](const std::string& h) {
        auto colon = h.find(':');
        return colon == std::string::npos || colon == 0 ? std::string("expected \"Name: value\"")
                                                        : std::string();
      });
}

std::map<std::string, std::string> ParseHeaders(const std::vector<std::string>& headers) {
  std::map<std::string, std::string> out;
  for (const auto& h : headers) {
    auto colon = h.find(':');
    auto value = h.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    out[h.substr(0, colon)] = value;
  }
  return out;
}

namespace {
int exit_code = 0;
}  // namespace

int ExitCode() { return exit_code; }
void SetExitCode(int code) { exit_code = code; }

std::string CheckParticipantFlag(const std::string& value) {
  auto eq = value.find('=');
  if (eq == std::string::npos || !steps::saga::IsValidStepName(value.substr(0, eq)) ||
      value.compare(eq + 1, 7, "http://") != 0) {
    return "expected NAME=http://HOST:PORT with NAME of [a-z0-9_]";
  }
  return "";
}

std::string CheckDuration(const std::string& value) {
  return orchestrator::ParseDuration(value) ? "" : "expected a duration such as 90s, 30m, 1h or 2d";
}

void ReadFlagsFromEnvironment(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const auto& names = opt->get_lnames();
    if (names.empty() || !opt->get_envname().empty() || names.front() == "help") continue;
    std::string env = "IDEMSAGA_";
    for (char c : names.front()) {
      env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    opt->envname(env);
  }
  for (CLI::App* sub : app.get_subcommands({})) ReadFlagsFromEnvironment(*sub);
}

void AddLogFormatOption(CLI::App& app) {
  app.add_option_function<std::string>(
         "--log-format",
         [](const std::string& format) {
           common::SetLogFormat(format == "json" ? common::LogFormat::kJson
                                                 : common::LogFormat::kText);
         },
         "log lines as key=value text (the default) or one JSON object per line")
      ->check(CLI::IsMember({"text", "json"}));
}

}  // namespace idemsaga::app
