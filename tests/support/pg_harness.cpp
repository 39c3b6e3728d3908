#include "tests/support/pg_harness.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "common/pg/cluster.hpp"
#include "common/pg/migrate.hpp"
#include "common/pg/url.hpp"

namespace test_support {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Owns what this process created on the server; drops it at exit.
class Registry {
 public:
  // Runs from the test environment's TearDown: libpqxx must not be used from static
  // destructors (its own statics may be gone by then).
  void CleanUp() {
    std::lock_guard lock(mutex_);
    try {
      for (const auto& [kind, name] : templates_) Drop(name);
    } catch (...) {
    }
    templates_.clear();
    cluster_.reset();
  }

  const std::string& Server() {
    std::call_once(server_once_, [&] {
      server_url_ = Env("IDEMSAGA_TEST_DATABASE_URL");
      if (server_url_.empty()) {
        std::ifstream in(Env("IDEMSAGA_TEST_CLUSTER_FILE"));
        std::getline(in, server_url_);
      }
      if (server_url_.empty()) {
        cluster_ = idemsaga::common::pg::PrivateCluster::Start(
            {.dir = idemsaga::common::pg::PrivateCluster::MakeTempDir(),
             .durable = false,
             .temporary = true});
        server_url_ = cluster_->Url();
      }
    });
    return server_url_;
  }

  std::string Template(const std::string& kind) {
    std::lock_guard lock(mutex_);
    auto it = templates_.find(kind);
    if (it != templates_.end()) return it->second;
    std::string name = Prefix() + "tmpl_" + kind;
    Drop(name);
    idemsaga::common::pg::CreateDatabaseIfMissing(Server(), name);
    {
      pqxx::connection conn(idemsaga::common::pg::WithDatabase(Server(), name));
      idemsaga::common::pg::Migrate(conn, kind);
    }
    templates_[kind] = name;
    return name;
  }

  std::string Prefix() const { return "idemsaga_test_" + std::to_string(getpid()) + "_"; }

  void Drop(const std::string& name) {
    pqxx::connection conn(idemsaga::common::pg::WithDatabase(Server(), "postgres"));
    pqxx::nontransaction tx(conn);
    // DROP DATABASE takes no parameters; names are ours, quoted as identifiers.
    tx.exec("DROP DATABASE IF EXISTS " + tx.quote_name(name) + " WITH (FORCE)");
  }

  void Create(const std::string& name, const std::string& tmpl) {
    pqxx::connection conn(idemsaga::common::pg::WithDatabase(Server(), "postgres"));
    pqxx::nontransaction tx(conn);
    tx.exec("CREATE DATABASE " + tx.quote_name(name) + " TEMPLATE " + tx.quote_name(tmpl));
  }

 private:
  std::once_flag server_once_;
  std::string server_url_;
  std::unique_ptr<idemsaga::common::pg::PrivateCluster> cluster_;
  std::mutex mutex_;
  std::map<std::string, std::string> templates_;
};

Registry& Instance() {
  static Registry registry;
  return registry;
}

std::atomic<int> next_database{0};

class CleanUpEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { Instance().CleanUp(); }
};

[[maybe_unused]] ::testing::Environment* const kCleanUp =
    ::testing::AddGlobalTestEnvironment(new CleanUpEnvironment);

}  // namespace

const std::string& ServerUrl() { return Instance().Server(); }

ScratchDatabase::ScratchDatabase(const std::string& kind) {
  auto& registry = Instance();
  std::string tmpl = registry.Template(kind);
  name_ = registry.Prefix() + std::to_string(next_database++) + "_" + kind;
  registry.Create(name_, tmpl);
  url_ = idemsaga::common::pg::WithDatabase(registry.Server(), name_);
}

ScratchDatabase::~ScratchDatabase() {
  try {
    Instance().Drop(name_);
  } catch (...) {
  }
}

}  // namespace test_support
