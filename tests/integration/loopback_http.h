// Raw TCP and HTTP/1.0 on loopback for tests of ztd's metrics endpoint and of a Prometheus:
// idle connections that never send a byte, and a GET timed from connect to the last byte.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace zt::testing {

// A connected TCP socket to 127.0.0.1:`port`, or -1.
inline int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A TCP port on loopback that nothing listens on now (bound, read and closed: another process
// may take it before the caller does, rarely).
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Connections that stay open and silent until the object goes away.
class IdleConnections {
 public:
  IdleConnections(int port, int count) {
    for (int i = 0; i < count; ++i) {
      const int fd = ConnectLoopback(port);
      if (fd >= 0) fds_.push_back(fd);
    }
  }
  ~IdleConnections() {
    for (int fd : fds_) ::close(fd);
  }
  IdleConnections(const IdleConnections&) = delete;
  IdleConnections& operator=(const IdleConnections&) = delete;
  size_t size() const { return fds_.size(); }

 private:
  std::vector<int> fds_;
};

struct Scrape {
  // The whole response (status line, headers, body); empty when the deadline passed first.
  std::string response;
  double seconds = 0;
};

// GET `target` (a path with its query) over a new HTTP/1.0 connection, reading until the
// server closes it or `timeout` ends.
inline Scrape HttpGet(int port, const std::string& target, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  Scrape result;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return result;
  const std::string request = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  std::string response;
  bool complete = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                  static_cast<ssize_t>(request.size());
  while (complete) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) {
      complete = false;
      break;
    }
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0) complete = false;
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (complete) result.response = std::move(response);
  return result;
}

// GET /metrics over a new connection, reading until the server closes it or `timeout` ends.
inline Scrape ScrapeMetrics(int port, std::chrono::milliseconds timeout) {
  return HttpGet(port, "/metrics", timeout);
}

// The body of an HTTP response (after the blank line ending the headers); empty without one.
inline std::string HttpBody(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

}  // namespace zt::testing
