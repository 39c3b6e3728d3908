#include <string>

#include "cmd/idemsaga/commands.hpp"

namespace idemsaga_cmd {

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

}  // namespace idemsaga_cmd
