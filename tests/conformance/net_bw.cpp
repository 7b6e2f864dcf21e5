// hmc-conformance-net-bw: quick bandwidth check of a net provider on this host,
// side by side with what the host itself can do.
//
//   hmc-conformance-net-bw PLUGIN [SIZE_MIB (64)] [ITERS (20)]
//
// A forked target process registers a SIZE region and receives messages; this
// process puts SIZE bytes ITERS times (each put waited for: for tcp that is the
// target's ack, for shm the end of the single copy), then sends ITERS messages
// of SIZE (all posted, then all waited, until the target says it has them).
// Baselines, same sizes: memcpy between two prefaulted buffers in one process,
// and a plain TCP stream over loopback between two processes (kernel default
// buffers and 4 MiB buffers). GB/s = 1e9 bytes/s. Not a test: it prints.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "net_kit.h"

using namespace hmc_conformance;

namespace {

double gbps(size_t bytes, Clock::duration d) {
  return static_cast<double>(bytes) / std::chrono::duration<double>(d).count() / 1e9;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "hmc-conformance-net-bw: %s\n", what.c_str());
  std::exit(1);
}

void must(bool ok, const std::string& what) {
  if (!ok) die(what);
}

int send_wait(Session& s, void* conn, const void* buf, size_t len) {
  void* req = nullptr;
  int rc = s.p->send_msg(s.state, conn, buf, len, &req);
  return rc < 0 ? rc : s.wait(req, std::chrono::seconds(120)).rc;
}

int recv_wait(Session& s, void* conn, void* buf, size_t cap) {
  void* req = nullptr;
  int rc = s.p->recv_msg(s.state, conn, buf, cap, &req);
  return rc < 0 ? rc : s.wait(req, std::chrono::seconds(120)).rc;
}

// The target: listens, sends its rkey, takes ITERS messages, says so, waits for bye.
void target(const std::string& plugin, size_t size, int iters, int addr_fd) {
  Session s;
  must(s.open(plugin), "init: " + s.reason);
  char addr[HMC_NET_ADDR_MAX];
  size_t addr_len = 0;
  void* listener = nullptr;
  must(s.p->listen(s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &listener) == 0, "listen");
  must(write(addr_fd, addr, addr_len) == static_cast<ssize_t>(addr_len), "write address");
  close(addr_fd);
  void* conn = s.accept(listener, nullptr);
  must(conn != nullptr, "accept");
  std::vector<char> region(size, 1), inbox(size, 1);
  void* mr = nullptr;
  must(s.p->reg_mem(s.state, region.data(), size, HMC_MEM_HOST, &mr) == 0, "reg_mem");
  char rkey[HMC_NET_RKEY_MAX];
  size_t rkey_len = 0;
  must(s.p->pack_rkey(s.state, mr, rkey, sizeof(rkey), &rkey_len) == 0, "pack_rkey");
  must(send_wait(s, conn, rkey, rkey_len) == 0, "send rkey");
  // All receives posted up front (into one buffer: only the speed counts here).
  std::vector<void*> reqs(iters + 1);
  for (auto& r : reqs) must(s.p->recv_msg(s.state, conn, inbox.data(), size, &r) == 0, "recv");
  for (auto& r : reqs) must(s.wait(r, std::chrono::seconds(120)).rc == 0, "recv");
  must(send_wait(s, conn, "got", 4) == 0, "send got");
  char bye[4];
  recv_wait(s, conn, bye, sizeof(bye));
  s.p->dereg_mem(s.state, mr);
}

void provider_bw(const std::string& plugin, size_t size, int iters) {
  int fds[2];
  must(pipe(fds) == 0, "pipe");
  pid_t pid = fork();  // before any provider thread exists in this process
  if (pid == 0) {
    close(fds[0]);
    target(plugin, size, iters, fds[1]);
    _exit(0);
  }
  close(fds[1]);
  char addr[HMC_NET_ADDR_MAX];
  ssize_t addr_len = read(fds[0], addr, sizeof(addr));
  must(addr_len > 0, "target address");
  Session s;
  must(s.open(plugin), "init: " + s.reason);
  void* conn = nullptr;
  must(s.p->connect(s.state, addr, static_cast<size_t>(addr_len), "bw", 2, &conn) == 0, "connect");
  must(s.wait_connected(conn) == 0, "connected");
  char rkey[HMC_NET_RKEY_MAX];
  void* req = nullptr;
  must(s.p->recv_msg(s.state, conn, rkey, sizeof(rkey), &req) == 0, "recv rkey");
  Outcome o = s.wait(req);
  must(o.rc == 0, "rkey: " + o.message);
  std::vector<char> src(size, 2);

  auto put_once = [&] {
    void* r = nullptr;
    must(s.p->put(s.state, conn, src.data(), size, nullptr, rkey, o.bytes, 0, &r) == 0, "put");
    Outcome po = s.wait(r, std::chrono::seconds(120));
    must(po.rc == 0, "put: " + po.message);
  };
  put_once();  // warm up: pages, socket buffers
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) put_once();
  const double put_bw = gbps(size * iters, Clock::now() - t0);

  must(send_wait(s, conn, src.data(), size) == 0, "warm-up send");
  std::vector<void*> reqs(iters);
  t0 = Clock::now();
  for (auto& r : reqs) must(s.p->send_msg(s.state, conn, src.data(), size, &r) == 0, "send");
  for (auto& r : reqs) must(s.wait(r, std::chrono::seconds(120)).rc == 0, "send");
  char got[4];
  must(recv_wait(s, conn, got, sizeof(got)) == 0, "recv got");
  const double msg_bw = gbps(size * iters, Clock::now() - t0);
  send_wait(s, conn, "bye", 4);
  s.close();
  int status = 0;
  waitpid(pid, &status, 0);
  must(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "target process ended badly (status " + std::to_string(status) + ")");
  std::printf("%-28s put %7.2f GB/s   send_msg %7.2f GB/s\n",
              ("provider " + plugin.substr(plugin.find_last_of('/') + 1)).c_str(), put_bw, msg_bw);
}

void memcpy_bw(size_t size, int iters) {
  std::vector<char> a(size, 1), b(size, 2);
  std::memcpy(b.data(), a.data(), size);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    a[i] = static_cast<char>(i);
    std::memcpy(b.data(), a.data(), size);
  }
  std::printf("%-28s %7.2f GB/s\n", "memcpy (one thread)", gbps(size * iters, Clock::now() - t0));
}

// Plain TCP: a child writes ITERS x SIZE, this process reads into one SIZE buffer.
void tcp_bw(size_t size, int iters, int sockbuf) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  if (sockbuf > 0) {
    setsockopt(l, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
    setsockopt(l, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
  }
  must(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(l, 1) == 0, "tcp listen");
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &alen);
  pid_t pid = fork();
  if (pid == 0) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (sockbuf > 0) {
      setsockopt(c, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf));
      setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf));
    }
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) _exit(1);
    std::vector<char> buf(size, 3);
    for (int i = 0; i < iters + 1; ++i) {
      for (size_t off = 0; off < size;) {
        ssize_t n = write(c, buf.data() + off, size - off);
        if (n <= 0) _exit(1);
        off += static_cast<size_t>(n);
      }
    }
    char ack;
    if (read(c, &ack, 1) != 1) _exit(1);
    _exit(0);
  }
  int c = accept(l, nullptr, nullptr);
  std::vector<char> buf(size, 4);
  auto read_one = [&] {
    for (size_t off = 0; off < size;) {
      ssize_t n = read(c, buf.data() + off, size - off);
      must(n > 0, "tcp read");
      off += static_cast<size_t>(n);
    }
  };
  read_one();  // warm up
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) read_one();
  const double bw = gbps(size * iters, Clock::now() - t0);
  must(write(c, "k", 1) == 1, "tcp ack");
  int status = 0;
  waitpid(pid, &status, 0);
  close(c);
  close(l);
  std::string name = sockbuf > 0 ? "plain TCP, " + std::to_string(sockbuf >> 20) + " MiB buffers"
                                 : "plain TCP, kernel buffers";
  std::printf("%-28s %7.2f GB/s\n", name.c_str(), bw);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: hmc-conformance-net-bw PLUGIN [SIZE_MIB] [ITERS]");
  const size_t size = (argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 64) << 20;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 20;
  must(size > 0 && iters > 0, "size and iterations must be positive");
  std::printf("%zu MiB x %d, GB/s = 1e9 bytes/s\n", size >> 20, iters);
  provider_bw(argv[1], size, iters);
  memcpy_bw(size, iters);
  tcp_bw(size, iters, 0);
  tcp_bw(size, iters, 4 << 20);
  return 0;
}
