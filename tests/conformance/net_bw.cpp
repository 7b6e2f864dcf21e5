// hmc-conformance-net-bw: quick bandwidth and latency check of a net provider
// on this host, side by side with what the host itself can do.
//
//   hmc-conformance-net-bw PLUGIN [SIZE_MIB (64)] [ITERS (20)] [shared|alloc]
//   hmc-conformance-net-bw PLUGIN latency [ROUNDS (20000)] [BYTES (8)] [spin]
//
// Bandwidth: a forked target process registers a SIZE region and receives
// messages; this process puts SIZE bytes ITERS times (each put waited for: for
// tcp that is the target's ack, for shm the end of the single copy), then sends
// ITERS messages of SIZE (all posted, then all waited, until the target says it
// has them). `shared` allocates the target's region as HMC_ALLOC_SHAREABLE
// does (a memfd mapped MAP_SHARED, fd kept open), the case where shm maps the
// region and copies with memcpy; `alloc` takes it from the plugin's mem_alloc
// (HMC_NET_CAP_MEM_ALLOC), already registered. Baselines, same sizes: memcpy between two
// prefaulted buffers in one process (into private memory and, with `shared`,
// into a MAP_SHARED memfd), and a plain TCP stream over loopback between two
// processes (kernel default buffers and 4 MiB buffers). GB/s = 1e9 bytes/s.
//
// Latency: ping-pong of BYTES-byte messages with a forked target; each side
// posts its next receive before it sends, and waits as libhmc's Request::wait
// does (200 polls with a yield in between, then sleep until the plugin's
// wake; with `spin`, polled back to back with no yield, as ucx_perftest polls, which
// shows what the provider itself costs). Prints half the round trip (mean, median and
// percentiles, us), next to the same
// ping-pong over a plain Unix socket pair and TCP loopback (blocking calls).
// Not a test: it prints.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

constexpr int kHostSpins = 200;  // libhmc's Request::wait polls this often before sleeping

// The target's end of a run: listens, hands its address to the parent, accepts.
struct TargetEnd {
  Session s;
  void* conn = nullptr;
};

void target_open(TargetEnd& t, const std::string& plugin, int addr_fd) {
  must(t.s.open(plugin), "init: " + t.s.reason);
  char addr[HMC_NET_ADDR_MAX];
  size_t addr_len = 0;
  void* listener = nullptr;
  must(t.s.p->listen(t.s.state, "127.0.0.1", addr, sizeof(addr), &addr_len, &listener) == 0,
       "listen");
  must(write(addr_fd, addr, addr_len) == static_cast<ssize_t>(addr_len), "write address");
  close(addr_fd);
  t.conn = t.s.accept(listener, nullptr);
  must(t.conn != nullptr, "accept");
}

// Forks a target running `body`, then connects this process's session to it.
// Fork comes first, before any provider thread exists in this process.
template <class Body>
pid_t start_target(Session& s, void*& conn, const std::string& plugin, Body body) {
  int fds[2];
  must(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    {
      TargetEnd t;  // closed (listener file unlinked) before _exit
      target_open(t, plugin, fds[1]);
      body(t);
    }
    _exit(0);
  }
  close(fds[1]);
  char addr[HMC_NET_ADDR_MAX];
  ssize_t addr_len = read(fds[0], addr, sizeof(addr));
  close(fds[0]);
  must(addr_len > 0, "target address");
  must(s.open(plugin), "init: " + s.reason);
  must(s.p->connect(s.state, addr, static_cast<size_t>(addr_len), "bw", 2, &conn) == 0, "connect");
  must(s.wait_connected(conn) == 0, "connected");
  return pid;
}

void reap(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  must(WIFEXITED(status) && WEXITSTATUS(status) == 0,
       "target process ended badly (status " + std::to_string(status) + ")");
}

std::string plugin_label(const std::string& plugin) {
  return "provider " + plugin.substr(plugin.find_last_of('/') + 1);
}

// Bandwidth target: sends its rkey, takes ITERS + 1 messages, says so, waits for bye.
enum class Target { kPrivate, kShared, kAlloc };

void bw_target(TargetEnd& t, size_t size, int iters, Target kind) {
  Session& s = t.s;
  std::vector<char> private_region;
  std::unique_ptr<SharedMem> shared_region;
  char* region = nullptr;
  void* mr = nullptr;
  if (kind == Target::kAlloc) {
    must(s.has(HMC_NET_CAP_MEM_ALLOC), "the plugin has no mem_alloc (HMC_NET_CAP_MEM_ALLOC)");
    void* ptr = nullptr;
    must(s.p->mem_alloc(s.state, size, &ptr, &mr) == 0, "mem_alloc");
    region = static_cast<char*>(ptr);
    std::memset(region, 1, size);
  } else if (kind == Target::kShared) {
    shared_region = std::make_unique<SharedMem>(size, 1);
    must(shared_region->data() != nullptr, "shared region: " + shared_region->error());
    region = shared_region->data();
  } else {
    private_region.assign(size, 1);
    region = private_region.data();
  }
  std::vector<char> inbox(size, 1);
  if (mr == nullptr) must(s.p->reg_mem(s.state, region, size, HMC_MEM_HOST, &mr) == 0, "reg_mem");
  char rkey[HMC_NET_RKEY_MAX];
  size_t rkey_len = 0;
  must(s.p->pack_rkey(s.state, mr, rkey, sizeof(rkey), &rkey_len) == 0, "pack_rkey");
  must(send_wait(s, t.conn, rkey, rkey_len) == 0, "send rkey");
  // All receives posted up front (into one buffer: only the speed counts here).
  std::vector<void*> reqs(iters + 1);
  for (auto& r : reqs) must(s.p->recv_msg(s.state, t.conn, inbox.data(), size, &r) == 0, "recv");
  for (auto& r : reqs) must(s.wait(r, std::chrono::seconds(120)).rc == 0, "recv");
  must(send_wait(s, t.conn, "got", 4) == 0, "send got");
  char bye[4];
  recv_wait(s, t.conn, bye, sizeof(bye));
  if (kind == Target::kAlloc) s.p->mem_free(s.state, region, mr);
  else s.p->dereg_mem(s.state, mr);
}

const char* target_label(Target kind) {
  return kind == Target::kShared ? " (shared)" : kind == Target::kAlloc ? " (mem_alloc)" : "";
}

double provider_bw(const std::string& plugin, size_t size, int iters, Target kind) {
  Session s;
  void* conn = nullptr;
  pid_t pid =
      start_target(s, conn, plugin, [&](TargetEnd& t) { bw_target(t, size, iters, kind); });
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
  put_once();  // warm up: pages, socket buffers, shm's mapping of a shared region
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
  reap(pid);
  std::printf("%-34s put %7.2f GB/s   send_msg %7.2f GB/s\n",
              (plugin_label(plugin) + target_label(kind)).c_str(), put_bw, msg_bw);
  return put_bw;
}

double memcpy_bw(size_t size, int iters, bool shared) {
  std::vector<char> a(size, 1), private_dst;
  std::unique_ptr<SharedMem> shared_dst;
  char* b = nullptr;
  if (shared) {
    shared_dst = std::make_unique<SharedMem>(size, 2);
    must(shared_dst->data() != nullptr, "shared buffer: " + shared_dst->error());
    b = shared_dst->data();
  } else {
    private_dst.assign(size, 2);
    b = private_dst.data();
  }
  std::memcpy(b, a.data(), size);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    a[i] = static_cast<char>(i);
    std::memcpy(b, a.data(), size);
  }
  const double bw = gbps(size * iters, Clock::now() - t0);
  std::printf("%-34s %7.2f GB/s\n",
              shared ? "memcpy into a MAP_SHARED memfd" : "memcpy (one thread)", bw);
  return bw;
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
  std::printf("%-34s %7.2f GB/s\n", name.c_str(), bw);
}

// Latency target: answers every BYTES-byte ping with a pong of the same size,
// then takes a stream of `rounds` messages (all receives posted up front) and
// says "got".
// `spins`: kHostSpins (as libhmc waits) or Session::kBusyPoll (`spin`).
void lat_target(TargetEnd& t, int rounds, size_t bytes, int spins) {
  Session& s = t.s;
  std::vector<char> in(bytes + 1), out(bytes, 3);
  void* r = nullptr;
  must(s.p->recv_msg(s.state, t.conn, in.data(), in.size(), &r) == 0, "recv");
  for (int i = 0; i < rounds; ++i) {
    must(s.wait(r, std::chrono::seconds(60), spins).rc == 0, "recv ping");
    if (i + 1 < rounds) must(s.p->recv_msg(s.state, t.conn, in.data(), in.size(), &r) == 0, "recv");
    void* sr = nullptr;
    must(s.p->send_msg(s.state, t.conn, out.data(), bytes, &sr) == 0, "send pong");
    must(s.wait(sr, std::chrono::seconds(60), spins).rc == 0, "send pong");
  }
  std::vector<void*> reqs(rounds);
  for (auto& q : reqs) must(s.p->recv_msg(s.state, t.conn, in.data(), in.size(), &q) == 0, "recv");
  for (auto& q : reqs) must(s.wait(q, std::chrono::seconds(60), spins).rc == 0, "recv");
  must(send_wait(s, t.conn, "got", 4) == 0, "send got");
}

void print_latency(const std::string& what, std::vector<double>& half_rtt_us) {
  double sum = 0;
  for (double v : half_rtt_us) sum += v;
  std::sort(half_rtt_us.begin(), half_rtt_us.end());
  auto at = [&](double q) { return half_rtt_us[static_cast<std::size_t>(q * (half_rtt_us.size() - 1))]; };
  std::printf("%-34s half RTT mean %7.2f us   median %7.2f us   p90 %7.2f   p99 %7.2f   p99.9 %7.2f\n",
              what.c_str(), sum / static_cast<double>(half_rtt_us.size()), at(0.5), at(0.9), at(0.99), at(0.999));
}

constexpr int kWarmRounds = 1000;

void provider_latency(const std::string& plugin, int rounds, size_t bytes, int spins) {
  const int total = kWarmRounds + rounds;
  Session s;
  void* conn = nullptr;
  pid_t pid = start_target(s, conn, plugin, [&](TargetEnd& t) { lat_target(t, total, bytes, spins); });
  std::vector<char> in(bytes + 1), out(bytes, 4);
  std::vector<double> half;
  half.reserve(rounds);
  for (int i = 0; i < total; ++i) {
    void* rr = nullptr;
    void* sr = nullptr;
    must(s.p->recv_msg(s.state, conn, in.data(), in.size(), &rr) == 0, "recv");
    const auto t0 = Clock::now();
    must(s.p->send_msg(s.state, conn, out.data(), bytes, &sr) == 0, "send ping");
    must(s.wait(sr, std::chrono::seconds(60), spins).rc == 0, "send ping");
    Outcome o = s.wait(rr, std::chrono::seconds(60), spins);
    must(o.rc == 0 && o.bytes == bytes, "recv pong: " + o.message);
    if (i >= kWarmRounds)
      half.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
  }
  // Message rate: all sends posted back to back, then all waited, until "got".
  std::vector<void*> reqs(total);
  const auto t0 = Clock::now();
  for (auto& q : reqs) must(s.p->send_msg(s.state, conn, out.data(), bytes, &q) == 0, "send");
  for (auto& q : reqs) must(s.wait(q, std::chrono::seconds(60), spins).rc == 0, "send");
  char got[4];
  must(recv_wait(s, conn, got, sizeof(got)) == 0, "recv got");
  const double rate = total / std::chrono::duration<double>(Clock::now() - t0).count();
  s.close();
  reap(pid);
  print_latency(plugin_label(plugin), half);
  std::printf("%-34s %7.3f million messages/s (%d posted back to back)\n",
              (plugin_label(plugin) + " rate").c_str(), rate / 1e6, total);
}

// The same ping-pong over two connected stream sockets, blocking read/write.
void socket_latency(const std::string& what, int a, int b, int rounds, size_t bytes) {
  const int total = kWarmRounds + rounds;
  auto xfer = [bytes](int fd, char* buf, bool send) {
    for (size_t off = 0; off < bytes;) {
      ssize_t n = send ? write(fd, buf + off, bytes - off) : read(fd, buf + off, bytes - off);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  };
  pid_t pid = fork();
  if (pid == 0) {
    close(a);
    std::vector<char> buf(bytes + 1);
    for (int i = 0; i < total; ++i) {
      if (!xfer(b, buf.data(), false) || !xfer(b, buf.data(), true)) _exit(1);
    }
    _exit(0);
  }
  close(b);
  std::vector<char> buf(bytes + 1, 5);
  std::vector<double> half;
  for (int i = 0; i < total; ++i) {
    const auto t0 = Clock::now();
    must(xfer(a, buf.data(), true) && xfer(a, buf.data(), false), what + " ping-pong");
    if (i >= kWarmRounds)
      half.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
  }
  close(a);
  reap(pid);
  print_latency(what, half);
}

void unix_latency(int rounds, size_t bytes) {
  int sv[2];
  must(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  socket_latency("plain Unix socket pair", sv[0], sv[1], rounds, bytes);
}

void tcp_latency(int rounds, size_t bytes) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  must(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(l, 1) == 0, "tcp listen");
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &alen);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  must(connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "tcp connect");
  int d = accept(l, nullptr, nullptr);
  must(d >= 0, "tcp accept");
  close(l);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(d, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  socket_latency("plain TCP loopback", c, d, rounds, bytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    die("usage: hmc-conformance-net-bw PLUGIN [SIZE_MIB] [ITERS] [shared|alloc]\n"
        "       hmc-conformance-net-bw PLUGIN latency [ROUNDS] [BYTES] [spin]");
  }
  const std::string plugin = argv[1];
  if (argc > 2 && std::strcmp(argv[2], "latency") == 0) {
    const int rounds = argc > 3 ? std::atoi(argv[3]) : 20000;
    const size_t bytes = argc > 4 ? std::strtoull(argv[4], nullptr, 0) : 8;
    must(rounds > 0 && bytes > 0, "rounds and bytes must be positive");
    int spins = kHostSpins;
    if (argc > 5) {
      must(std::strcmp(argv[5], "spin") == 0, std::string("unknown wait '") + argv[5] + "' (spin)");
      spins = Session::kBusyPoll;
    }
    std::printf("ping-pong of %zu-byte messages, %d rounds after %d warm-up rounds, %s\n", bytes,
                rounds, kWarmRounds, spins == Session::kBusyPoll ? "polled back to back" : "waited as libhmc waits");
    provider_latency(plugin, rounds, bytes, spins);
    unix_latency(rounds, bytes);
    tcp_latency(rounds, bytes);
    return 0;
  }
  const size_t size = (argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 64) << 20;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 20;
  const std::string mode = argc > 4 ? argv[4] : "";
  const bool shared = mode == "shared";
  must(size > 0 && iters > 0, "size and iterations must be positive");
  must(mode.empty() || shared || mode == "alloc", "unknown mode '" + mode + "'");
  std::printf("%zu MiB x %d, GB/s = 1e9 bytes/s\n", size >> 20, iters);
  const double put = provider_bw(plugin, size, iters,
                                 shared ? Target::kShared : mode == "alloc" ? Target::kAlloc : Target::kPrivate);
  const double copy = memcpy_bw(size, iters, false);
  if (shared) {
    const double shared_copy = memcpy_bw(size, iters, true);
    std::printf("%-34s %7.0f %% of memcpy, %.0f %% of memcpy into shared memory\n", "put / memcpy",
                100 * put / copy, 100 * put / shared_copy);
  } else {
    std::printf("%-34s %7.0f %% of memcpy\n", "put / memcpy", 100 * put / copy);
  }
  tcp_bw(size, iters, 0);
  tcp_bw(size, iters, 4 << 20);
  return 0;
}
