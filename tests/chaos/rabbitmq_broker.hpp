// A private RabbitMQ broker for tests: rabbitmq-server from Debian's package with a node,
// ports (AMQP, distribution, epmd) and a data directory of its own, on loopback, and no
// plugins. Its processes die with the thread that started them (chaos::Process), so nothing
// outlives the test. Restartable on the same data: durable queues and persistent messages
// survive Stop()/Start(), as they survive a broker restart in production.
//
// Not thread-safe.
//   chaos::RabbitBroker broker(dir);   // started; broker.Url() is amqp://guest:guest@...
//   broker.Stop(); broker.Start();
#pragma once

#include <memory>
#include <string>

#include "tests/chaos/chaos_harness.hpp"

namespace chaos {

class RabbitBroker {
 public:
  // Starts it in `dir` (created), logging to dir/rabbitmq.log.
  explicit RabbitBroker(std::string dir);
  ~RabbitBroker();

  std::string Url() const;
  void Start();  // waits until it accepts AMQP connections (throws after 90 s)
  void Stop();   // SIGTERM: a clean shutdown, waited for
  void Kill();   // SIGKILL: a crash

 private:
  std::string dir_;
  int amqp_port_, dist_port_, epmd_port_;
  std::unique_ptr<Process> epmd_;
  std::unique_ptr<Process> server_;
};

}  // namespace chaos
