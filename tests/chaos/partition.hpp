// A network partition of one hop on loopback: a TCP forwarder the harness owns, listening on a
// free 127.0.0.1 port and forwarding every connection to a target port. Point exactly one
// client at it (the orchestrator's URL for one participant, or for its database) and the other
// hops stay direct.
//
// Why a forwarder and not network namespaces with veth pairs or packet filters: those need
// root (CAP_NET_ADMIN), and the suite runs as an ordinary user (scripts/test, CI); nothing in a
// test may call sudo. A forwarder needs no privilege and touches no one else's traffic.
//
// What the two ends see is what a partition that drops packets shows them: silence until
// their own timeouts fire.
//   Partition(): no byte moves either way on an open connection (what was sent waits, as it
//   would in retransmission, and flows on Heal() if neither end gave up); a new connection is
//   never answered: the listener's accept queue is shrunk and filled, so the kernel drops
//   every SYN, the client's connect() retries and times out, and nobody gets an RST.
//   Heal(): bytes held back flow, waiting SYNs get through on their next retransmission.
//   Reset(): every open connection is closed with an RST on both ends (a peer that restarted),
//   then forwarding goes on.
// One difference remains, below the application: TCP keepalive probes and TCP_USER_TIMEOUT
// are answered by the forwarder's kernel, so they do not detect the partition; an end that
// relies on them alone waits for Heal() instead of for its kernel's verdict.
//
// Thread-safe: the control calls may come from any thread; all socket work happens on the
// forwarder's own thread, and a control call returns once that thread has applied it.
//   chaos::Forwarder payment(stack.ParticipantPort("payment"));
//   payment.Partition(); ...; payment.Heal();
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace chaos {

class Forwarder {
 public:
  // Forwards to 127.0.0.1:`target_port`, healed.
  explicit Forwarder(int target_port);
  ~Forwarder();
  Forwarder(const Forwarder&) = delete;
  Forwarder& operator=(const Forwarder&) = delete;

  int port() const { return port_; }
  void Heal();
  void Partition();
  void Reset();
  bool partitioned() const { return partitioned_; }
  long long connections() const { return connections_; }  // accepted and forwarded so far
  long long bytes() const { return bytes_; }              // moved either way so far

 private:
  enum class Command { kNone, kHeal, kPartition, kReset, kStop };
  void Apply(Command c);  // from a control call: hands `c` to the thread, waits until done
  void Loop();

  int port_ = 0;
  int target_port_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a control call writes a byte: the poll loop looks at command_
  std::mutex control_;      // one control call at a time
  std::mutex mutex_;
  std::condition_variable done_;
  Command command_ = Command::kNone;  // guarded by mutex_; kNone once applied
  std::atomic<bool> partitioned_{false};
  std::atomic<long long> connections_{0}, bytes_{0};
  std::thread thread_;
};

}  // namespace chaos
