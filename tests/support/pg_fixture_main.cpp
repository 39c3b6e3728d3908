// CTest fixture: `pg_fixture start DIR` starts the run's private cluster in DIR/cluster and
// writes its URL to DIR/url; `pg_fixture stop DIR` stops it and removes the cluster. As root,
// when the `postgres` user cannot reach DIR (a clone under /root), the cluster lives where
// PrivateCluster puts it instead, as `idemsaga dev`'s does. With IDEMSAGA_TEST_DATABASE_URL
// set, both do nothing (the tests use that server).
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "common/pg/cluster.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: pg_fixture start|stop DIR\n";
    return 2;
  }
  const char* external = std::getenv("IDEMSAGA_TEST_DATABASE_URL");
  if (external != nullptr && *external != '\0') return 0;
  std::string command = argv[1];
  std::filesystem::path dir = argv[2];
  try {
    if (command == "start") {
      idemsaga::common::pg::PrivateCluster::StopDetached(dir / "cluster",
                                                         true);  // leftovers of a killed run
      std::filesystem::create_directories(dir);
      auto cluster =
          idemsaga::common::pg::PrivateCluster::Start({.dir = dir / "cluster", .durable = false});
      std::ofstream(dir / "url") << cluster->Url() << "\n";
      std::cout << "test cluster ready at " << cluster->Url() << " in " << cluster->dir().string()
                << std::endl;
      cluster->Detach();
      return 0;
    }
    if (command == "stop") {
      idemsaga::common::pg::PrivateCluster::StopDetached(dir / "cluster", true);
      std::filesystem::remove(dir / "url");
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "pg_fixture: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "pg_fixture: unknown command " << command << "\n";
  return 2;
}
