// PrivateCluster against real initdb and postgres: where a cluster lives when the server's
// user cannot reach the folder asked for (root in a clone under /root), and what a failed
// start tells its caller once the folder with the logs is gone. Starts clusters of its own.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <pqxx/pqxx>

#include "common/pg/cluster.hpp"

namespace {

namespace fs = std::filesystem;
using idemsaga::common::pg::PrivateCluster;
using ::testing::HasSubstr;

// Removes a folder of the test's when the test ends, however it ends.
struct RemovedAtEnd {
  ~RemovedAtEnd() { fs::remove_all(path); }
  fs::path path;
};

std::string StartError(PrivateCluster::Options options) {
  try {
    PrivateCluster::Start(std::move(options));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// What the CTest fixture does (start, detach, stop later by folder), from a folder that only
// root may enter, as a checkout under /root is.
TEST(PrivateCluster, AsRootItRunsAndStopsOutsideAFolderThePostgresUserCannotEnter) {
  if (geteuid() != 0) GTEST_SKIP() << "only root runs the server as another user";
  RemovedAtEnd closed{PrivateCluster::MakeTempDir()};  // mkdtemp: 0700, root's
  fs::path asked = closed.path / "testpg" / "cluster";

  auto cluster = PrivateCluster::Start({.dir = asked, .durable = false});
  fs::path where = cluster->dir();
  EXPECT_NE(where, asked);
  EXPECT_EQ(where, PrivateCluster::ReachableDir(asked));
  EXPECT_EQ(where.parent_path(), "/var/lib/idemsaga");
  {
    pqxx::connection conn(cluster->Url());
    pqxx::nontransaction tx(conn);
    EXPECT_EQ(tx.exec1("SELECT 1")[0].as<int>(), 1);
  }
  cluster->Detach();
  cluster.reset();
  ASSERT_TRUE(fs::exists(where / "data" / "postmaster.pid"));

  PrivateCluster::StopDetached(asked, /*remove=*/true);
  EXPECT_FALSE(fs::exists(where));
}

TEST(PrivateCluster, AFailedInitdbPutsTheEndOfItsLogInTheError) {
  fs::path dir = PrivateCluster::MakeTempDir();
  // initdb refuses a data folder that holds anything.
  fs::create_directories(dir / "data");
  std::ofstream(dir / "data" / "stray") << "not a cluster\n";

  std::string error = StartError({.dir = dir, .durable = false, .temporary = true});
  EXPECT_THAT(error, HasSubstr("initdb failed"));
  EXPECT_THAT(error, HasSubstr("exists but is not empty"));
  EXPECT_FALSE(fs::exists(dir)) << "the log went with the folder: the message must carry it";
}

TEST(PrivateCluster, AServerThatCannotStartPutsTheEndOfItsLogInTheError) {
  // A listener on the port the server is told to use.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  fs::path dir = PrivateCluster::MakeTempDir();

  std::string error =
      StartError({.dir = dir, .port = ntohs(addr.sin_port), .durable = false, .temporary = true});
  close(fd);
  EXPECT_THAT(error, HasSubstr("did not start"));
  EXPECT_THAT(error, HasSubstr("could not bind"));
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
