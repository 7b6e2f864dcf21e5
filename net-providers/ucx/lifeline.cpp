#include "lifeline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace hmc_ucx {

namespace {

struct Head {
  uint32_t magic, version, conn, hello_len;
  uint64_t cookie;
  uint32_t worker_len, pad;
};
static_assert(sizeof(Head) == 32);

// IPv4 or IPv6 sockaddr for ip:port.
bool make_sockaddr(const std::string& ip, uint16_t port, sockaddr_storage& ss, socklen_t& len) {
  std::memset(&ss, 0, sizeof(ss));
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, ip.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    len = sizeof(sockaddr_in);
    return true;
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET6, ip.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// A non-blocking stream socket of `family` with int option `opt` at `level` set to 1.
int open_socket(int family, int level, int opt, std::string& why) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = errno_text("socket");
    return -1;
  }
  int one = 1;
  setsockopt(fd, level, opt, &one, sizeof(one));
  return fd;
}

}  // namespace

std::string encode(const Handshake& h) {
  Head head{kHandshakeMagic, kHandshakeVersion, h.conn, static_cast<uint32_t>(h.hello.size()),
            h.cookie, static_cast<uint32_t>(h.worker.size()), 0};
  std::string out(reinterpret_cast<const char*>(&head), sizeof(head));
  out.append(h.hello.begin(), h.hello.end());
  out.append(h.worker.begin(), h.worker.end());
  return out;
}

int decode(const std::string& in, size_t max_hello, Handshake& out, size_t& used, std::string& why) {
  if (in.size() < sizeof(Head)) return 1;
  Head head;
  std::memcpy(&head, in.data(), sizeof(head));
  if (head.magic != kHandshakeMagic) {
    why = "not an HMC ucx handshake";
    return -1;
  }
  if (head.version != kHandshakeVersion) {
    why = "ucx handshake version " + std::to_string(head.version) + " from the peer, " +
          std::to_string(kHandshakeVersion) + " here (HMC builds that differ)";
    return -1;
  }
  if (head.hello_len > max_hello || head.worker_len == 0 || head.worker_len > kMaxWorkerAddress) {
    why = "malformed handshake (hello " + std::to_string(head.hello_len) + " bytes, worker address " +
          std::to_string(head.worker_len) + " bytes)";
    return -1;
  }
  const size_t total = sizeof(Head) + head.hello_len + head.worker_len;
  if (in.size() < total) return 1;
  const char* p = in.data() + sizeof(Head);
  out.conn = head.conn;
  out.cookie = head.cookie;
  out.hello.assign(p, p + head.hello_len);
  out.worker.assign(p + head.hello_len, p + head.hello_len + head.worker_len);
  used = total;
  return 0;
}

bool parse_addr(const std::string& text, std::string& ip, uint16_t& port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  ip = text.substr(0, colon);
  if (ip.size() >= 2 && ip.front() == '[' && ip.back() == ']') ip = ip.substr(1, ip.size() - 2);
  unsigned value = 0;
  const char* begin = text.data() + colon + 1;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || begin == end || value == 0 || value > 65535) return false;
  port = static_cast<uint16_t>(value);
  sockaddr_storage ss;
  socklen_t len;
  return make_sockaddr(ip, port, ss, len);
}

std::string format_addr(const std::string& ip, uint16_t port) {
  return (ip.find(':') != std::string::npos ? "[" + ip + "]" : ip) + ":" + std::to_string(port);
}

int listen_socket(const std::string& ip, uint16_t& port, std::string& why) {
  sockaddr_storage ss;
  socklen_t len;
  if (!make_sockaddr(ip, port, ss, len)) {
    why = "'" + ip + "' is not an IP address";
    return -1;
  }
  const int fd = open_socket(ss.ss_family, SOL_SOCKET, SO_REUSEADDR, why);
  if (fd < 0) return -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    why = errno_text(("cannot listen on " + format_addr(ip, port)).c_str());
    close(fd);
    return -1;
  }
  port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

int connect_socket(const std::string& addr, std::string& why) {
  std::string ip;
  uint16_t port = 0;
  sockaddr_storage ss;
  socklen_t len;
  if (!parse_addr(addr, ip, port) || !make_sockaddr(ip, port, ss, len)) {
    why = "'" + addr + "' is not a ucx address (ip:port)";
    return -1;
  }
  const int fd = open_socket(ss.ss_family, IPPROTO_TCP, TCP_NODELAY, why);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
    why = errno_text(("connect to " + addr).c_str());
    close(fd);
    return -1;
  }
  return fd;
}

std::string peer_name(int fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  char text[INET6_ADDRSTRLEN] = {};
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown peer";
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return format_addr(text, ntohs(in->sin_port));
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
  return format_addr(text, ntohs(in6->sin6_port));
}

bool ended(int fd) {
  char byte;
  ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace hmc_ucx
