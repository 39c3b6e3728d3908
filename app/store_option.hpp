// --store postgres|redis|dynamodb, the one flag for where a participant keeps its keys: in
// the library's Participant::Run and the stock participants' commands alike.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace idemsaga::app {

// `stores`: the ones this participant can keep its keys in (all three by default).
inline CLI::Option* AddStoreOption(CLI::App* cmd, std::string& store,
                                   const std::vector<std::string>& stores = {"postgres", "redis",
                                                                             "dynamodb"}) {
  return cmd
      ->add_option("--store", store,
                   "where the keys are kept: postgres (--database-url), redis (--redis-url) or "
                   "dynamodb (--dynamodb-url); default: redis with --redis-url, else postgres")
      ->check(CLI::IsMember(stores));
}

}  // namespace idemsaga::app
