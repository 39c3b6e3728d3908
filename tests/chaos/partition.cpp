#include "tests/chaos/partition.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace chaos {
namespace {

// One forwarded connection: side 0 is the client's, side 1 the target's.
struct Pair {
  int fd[2] = {-1, -1};
  std::string pending[2];  // read from fd[i], not yet written to the other side
  size_t sent[2] = {0, 0};
  bool eof[2] = {false, false};   // fd[i] sent its FIN
  bool shut[2] = {false, false};  // ... and it was passed on (shutdown of the other side)
};

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

int PortOf(int fd, bool peer) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  auto* a = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, a, &len) : getsockname(fd, a, &len)) != 0) return -1;
  return ntohs(addr.sin_port);
}

// Closes with an RST instead of a FIN, as a peer whose connection state is gone answers.
void CloseWithReset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A connection to our own listener at 127.0.0.1:`port` that waits in its accept queue (the
// RST-free way to fill it), once connected or after a second; -1 if there is no socket.
int Filler(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = Loopback(port);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  pollfd p{fd, POLLOUT, 0};
  poll(&p, 1, 1000);
  return fd;
}

}  // namespace

Forwarder::Forwarder(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listen_fd_, SOMAXCONN) != 0 || pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error("forwarder: cannot listen on loopback");
  }
  port_ = PortOf(listen_fd_, false);
  thread_ = std::thread([this] { Loop(); });
}

Forwarder::~Forwarder() {
  Apply(Command::kStop);
  thread_.join();
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void Forwarder::Heal() { Apply(Command::kHeal); }
void Forwarder::Partition() { Apply(Command::kPartition); }
void Forwarder::Reset() { Apply(Command::kReset); }

void Forwarder::Apply(Command c) {
  std::lock_guard control(control_);
  std::unique_lock lock(mutex_);
  command_ = c;
  char byte = 1;
  if (write(wake_[1], &byte, 1) != 1) throw std::runtime_error("forwarder: cannot wake");
  done_.wait(lock, [&] { return command_ == Command::kNone; });
}

void Forwarder::Loop() {
  std::vector<std::unique_ptr<Pair>> pairs;
  std::map<int, int> fillers;  // local port -> fd
  bool cut = false;
  auto drop = [&](size_t i, bool reset) {
    for (int fd : pairs[i]->fd) reset ? CloseWithReset(fd) : (void)close(fd);
    pairs.erase(pairs.begin() + static_cast<long>(i));
  };
  for (;;) {
    std::vector<pollfd> polled = {{wake_[0], POLLIN, 0}, {cut ? -1 : listen_fd_, POLLIN, 0}};
    for (const auto& p : pairs) {
      for (int side = 0; side < 2; ++side) {
        short events = 0;
        if (!p->eof[side] && p->pending[side].empty()) events |= POLLIN;
        if (!p->pending[1 - side].empty()) events |= POLLOUT;
        // Partitioned: no socket is read or written, so nothing moves either way.
        polled.push_back({cut || events == 0 ? -1 : p->fd[side], events, 0});
      }
    }
    if (poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("forwarder: poll failed");
    }
    if (polled[0].revents != 0) {
      char bytes[16];
      while (read(wake_[0], bytes, sizeof bytes) > 0) {
      }
      std::lock_guard lock(mutex_);
      Command c = command_;
      if (c == Command::kPartition && !cut) {
        cut = true;
        // A backlog of 0 holds one connection; once one waits there, the kernel drops every
        // SYN (no RST), so a new client's connect() times out as across a partition.
        listen(listen_fd_, 0);
        tcp_info info{};
        socklen_t len = sizeof info;
        getsockopt(listen_fd_, IPPROTO_TCP, TCP_INFO, &info, &len);
        if (info.tcpi_unacked == 0) {  // a listener's tcpi_unacked: its accept queue's length
          int fd = Filler(port_);
          if (fd >= 0) fillers[PortOf(fd, false)] = fd;
        }
      } else if (c == Command::kReset || c == Command::kStop) {
        while (!pairs.empty()) drop(pairs.size() - 1, true);
      }
      if ((c == Command::kHeal || c == Command::kReset) && cut) {
        cut = false;
        listen(listen_fd_, SOMAXCONN);
      }
      if (c == Command::kStop) {
        for (const auto& [port, fd] : fillers) close(fd);
      }
      partitioned_ = cut;
      command_ = Command::kNone;
      done_.notify_all();
      if (c == Command::kStop) return;
      continue;  // the pairs may have changed: poll again
    }
    if (polled[1].revents != 0) {
      for (int client; (client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
        auto filler = fillers.find(PortOf(client, true));
        if (filler != fillers.end()) {
          close(filler->second);
          fillers.erase(filler);
          close(client);
          continue;
        }
        int target = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr = Loopback(target_port_);
        if (target < 0 || connect(target, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
          // The target refused: so does the forwarder (an RST, as the target itself sends).
          if (target >= 0) close(target);
          CloseWithReset(client);
          continue;
        }
        SetNonBlocking(client);
        SetNonBlocking(target);
        int one = 1;
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(target, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto p = std::make_unique<Pair>();
        p->fd[0] = client;
        p->fd[1] = target;
        pairs.push_back(std::move(p));
        ++connections_;
      }
    }
    // Newly accepted pairs have no entry in `polled`: they are served from the next round.
    size_t polled_pairs = (polled.size() - 2) / 2;
    for (size_t i = polled_pairs; i-- > 0;) {
      Pair& p = *pairs[i];
      bool broken = false;
      for (int side = 0; side < 2 && !broken; ++side) {
        const pollfd& pf = polled[2 + 2 * i + static_cast<size_t>(side)];
        if (pf.fd < 0 || pf.revents == 0) continue;
        if ((pf.events & POLLIN) != 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          char buf[65536];
          ssize_t n = recv(p.fd[side], buf, sizeof buf, 0);
          if (n > 0) {
            p.pending[side].assign(buf, static_cast<size_t>(n));
            p.sent[side] = 0;
          } else if (n == 0) {
            p.eof[side] = true;
          } else if (errno != EAGAIN && errno != EINTR) {
            broken = true;
          }
        }
        std::string& out = p.pending[1 - side];
        if (!broken && !out.empty() && (pf.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
          ssize_t n = send(p.fd[side], out.data() + p.sent[1 - side], out.size() - p.sent[1 - side],
                           MSG_NOSIGNAL);
          if (n > 0) {
            bytes_ += n;
            p.sent[1 - side] += static_cast<size_t>(n);
            if (p.sent[1 - side] == out.size()) out.clear();
          } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
            broken = true;
          }
        }
      }
      for (int side = 0; side < 2 && !broken; ++side) {
        if (p.eof[side] && p.pending[side].empty() && !p.shut[side]) {
          shutdown(p.fd[1 - side], SHUT_WR);  // pass the FIN on once its bytes are through
          p.shut[side] = true;
        }
      }
      if (broken) {
        drop(i, true);  // one side reset or failed: the other learns it the same way
      } else if (p.shut[0] && p.shut[1]) {
        drop(i, false);
      }
    }
  }
}

}  // namespace chaos
