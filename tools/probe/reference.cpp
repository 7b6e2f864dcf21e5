// References for the matrix, measured in this process on the same machine: a plain memcpy
// (what shm should approach) and a plain TCP stream over loopback (what tcp should approach).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "probe.h"

namespace hmc::probe {
namespace {

// The references move at most 4 GiB: rank 0 measures them while the other ranks wait in
// finalize's barrier, which gives up after a minute (-n 2500000 of 64 KiB over loopback TCP
// took longer than that, and the probe failed after measuring every pair).
int capped(std::size_t bytes, int iters) {
  constexpr std::size_t kMaxBytes = std::size_t{4} << 30;
  return static_cast<int>(std::clamp<std::size_t>(kMaxBytes / std::max<std::size_t>(bytes, 1), 1, iters));
}

// Tells the compiler that the memory at `p` is read here: the copies into it are kept, and
// no value they write can change the figure (as a sentinel compared with the data could).
inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace

double memcpy_gbps(std::size_t bytes, int iters) {
  iters = capped(bytes, iters);
  std::vector<uint8_t> src, dst;
  // Where the heap cannot give them the reference is not measured (0), rather than the
  // probe dying after measuring every pair.
  if (!heap_filled(src, bytes, 1).ok() || !heap_filled(dst, bytes, 2).ok()) return 0;
  std::memcpy(dst.data(), src.data(), bytes);  // fault the pages in
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    src[i % bytes] = static_cast<uint8_t>(i);
    std::memcpy(dst.data(), src.data(), bytes);
    keep(dst.data());
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(bytes) * iters / s / 1e9;
}

double tcp_stream_gbps(std::size_t bytes, int iters) {
  iters = capped(bytes, iters);
  const std::size_t messages = std::size_t(iters) + 1;  // the first warms up
  std::vector<uint8_t> out, buf;
  if (!heap_filled(out, bytes, 3).ok() || !heap_filled(buf, bytes, 0).ok()) return 0;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) || listen(lfd, 1) ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len)) {
    close(lfd);
    return 0;
  }
  std::thread sender([&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      for (std::size_t i = 0; i < messages; ++i)
        for (std::size_t off = 0; off < bytes;) {
          ssize_t n = send(fd, out.data() + off, bytes - off, 0);
          if (n <= 0) break;
          off += n;
        }
    } else {
      shutdown(lfd, SHUT_RDWR);  // no connection is coming: wake the accept below (Linux)
    }
    close(fd);
  });
  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) {  // 0 reads "not measured"
    sender.join();
    close(lfd);
    return 0;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::size_t total = 0, want = bytes * messages;
  while (total < want) {
    ssize_t n = recv(fd, buf.data() + (total % bytes), bytes - (total % bytes), 0);
    if (n <= 0) break;
    if (total < bytes && total + n >= bytes) t0 = std::chrono::steady_clock::now();  // first message warms up
    total += n;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sender.join();
  close(fd);
  close(lfd);
  return total == want ? static_cast<double>(bytes) * iters / s / 1e9 : 0;
}

}  // namespace hmc::probe
