// A private dynalite (an implementation of DynamoDB's API, in memory: scripts/dynalite.sh) for a
// test: a free loopback port, started as a child process of this one and stopped by its PID.
// Its tables live in its memory only, so Kill() loses them: it is a DynamoDB for the guard's
// protocol, not for durability. Runs as any user; the server dies with the test process
// (PR_SET_PDEATHSIG). Not thread-safe: one test thread drives it.
//   test_support::Dynalite dynamo;
//   idemsaga::common::dynamo::Client client({.url = dynamo.Url()});
#pragma once

#include <sys/types.h>

#include <string>

namespace test_support {

class Dynalite {
 public:
  Dynalite();  // returns once it answers ListTables
  ~Dynalite();
  Dynalite(const Dynalite&) = delete;
  Dynalite& operator=(const Dynalite&) = delete;

  // http://127.0.0.1:<port>
  std::string Url() const;
  int port() const { return port_; }

  // SIGKILL; waits for the process to end.
  void Kill();

 private:
  std::string log_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace test_support
