// Raw loopback sockets for the edge tests: send any bytes, hostile or slow, and read back what
// the server answers (or that it closed), without an HTTP client that would fix the request.
//
// Not thread-safe per socket; each function is self-contained.
//   edge::Socket s(port); s.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
//   auto answers = s.ReadAll();  // every response until the server closes
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace edge {

struct Answer {
  int status = 0;
  std::string head;  // status line and fields
  std::string body;
  std::string Header(std::string_view name) const {
    std::string needle = "\r\n" + std::string(name) + ": ";
    auto lower = [](std::string s) {
      for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    };
    auto at = lower(head).find(lower(needle));
    if (at == std::string::npos) return "";
    auto start = at + needle.size();
    return head.substr(start, head.find("\r\n", start) - start);
  }
};

class Socket {
 public:
  explicit Socket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd_);
      throw std::runtime_error("connect failed");
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_), pending_(std::move(other.pending_)) {
    other.fd_ = -1;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket& operator=(Socket&&) = delete;

  int fd() const { return fd_; }

  // False if the peer refused the bytes (it closed or reset).
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // No more bytes from us: a server sees the end of a half-sent request at once.
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }

  // The next response, or nullopt if the connection closed (or nothing came in `timeout`)
  // before its header was complete.
  std::optional<Answer> Read(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t end;
    while ((end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill(deadline)) return std::nullopt;
    }
    Answer a;
    a.head = pending_.substr(0, end + 2);
    if (a.head.size() < 12 || a.head.compare(0, 5, "HTTP/") != 0) return std::nullopt;
    a.status = std::atoi(a.head.c_str() + 9);
    size_t length = 0;
    if (auto cl = a.Header("Content-Length"); !cl.empty()) length = std::stoul(cl);
    bool bodiless = a.status < 200 || a.status == 204 || a.status == 304 || head_request_;
    if (bodiless) length = 0;
    while (pending_.size() < end + 4 + length) {
      if (!Fill(deadline)) {  // the status still counts; the body is what came
        a.body = pending_.substr(end + 4);
        pending_.clear();
        return a;
      }
    }
    a.body = pending_.substr(end + 4, length);
    pending_.erase(0, end + 4 + length);
    return a;
  }

  // Every response until the server closes the connection (or `timeout` passes).
  std::vector<Answer> ReadAll(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    std::vector<Answer> all;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      auto a = Read(left);
      if (!a) break;
      all.push_back(std::move(*a));
    }
    return all;
  }

  // True once the server has closed its side (EOF or reset) within `timeout`, having sent
  // nothing more than what a Read would consume.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Fill(deadline)) {
    }
    return closed_;
  }

  // Bytes received but not consumed by Read (for "nothing was sent").
  const std::string& pending() const { return pending_; }
  void ExpectHeadResponses(bool head) { head_request_ = head; }

 private:
  // Reads what is available; false on EOF, error or deadline.
  bool Fill(std::chrono::steady_clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[16384];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    pending_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string pending_;
  bool closed_ = false;
  bool head_request_ = false;
};

// Resident memory of this process, in bytes (/proc/self/statm).
inline long long ResidentBytes() {
  long long size = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace edge
