// The shared-memory message ring of the stream providers (net-providers/common/msg_ring.h):
// a writer and a reader thread, each with its own mapping of one memfd, as two processes
// would have; and the put marks a deregistration waits for (put_fence.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/msg_ring.h"
#include "common/put_fence.h"

using hmc_net::RingRecord;
using hmc_net::SharedRing;

namespace {

std::unique_ptr<SharedRing> map_of(const SharedRing& ring) {
  const hmc_net::RingOffer offer = ring.offer();
  std::string why;
  auto mapped = SharedRing::map("/proc/self/fd/" + std::to_string(offer.fd), offer, why);
  INFO(why);
  REQUIRE(mapped != nullptr);
  return mapped;
}

std::vector<char> random_message(std::mt19937_64& rng, size_t max) {
  std::vector<char> m(rng() % (max + 1));
  for (char& c : m) c = static_cast<char>(rng());
  return m;
}

}  // namespace

TEST_CASE("message ring: messages of any size arrive whole and in order", "[ring]") {
  std::string why;
  auto reader = SharedRing::create(64 << 10, true, why);
  REQUIRE(reader != nullptr);
  auto writer = map_of(*reader);
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  // Mostly small messages, some several times the ring, some empty.
  std::mt19937_64 rng(seed);
  std::vector<std::vector<char>> sent;
  for (int i = 0; i < 400; ++i) sent.push_back(random_message(rng, i % 10 == 0 ? 300 << 10 : 200));

  std::thread producer([&] {
    for (const auto& m : sent) {
      uint64_t done = 0;
      bool started = false;
      while (!started || done < m.size()) {
        if (writer->write(m.data(), m.size(), done)) {
          started = true;
        } else if (!writer->ask_space()) {
          std::this_thread::yield();
        }
      }
    }
  });
  size_t bells = 0;
  for (size_t i = 0; i < sent.size(); ++i) {
    std::vector<char> got;
    uint64_t total = 0;
    bool first = true;
    while (first || got.size() < total) {
      RingRecord rec{};
      if (!reader->next(rec, why)) {
        REQUIRE(why.empty());
        std::this_thread::yield();
        continue;
      }
      REQUIRE(((rec.flags & hmc_net::kRingFirst) != 0) == first);
      if (first) total = rec.total;
      first = false;
      const size_t at = got.size();
      REQUIRE(rec.len <= total - at);
      got.resize(at + rec.len, '\x5a');
      reader->copy(0, got.data() + at, rec.len);
      bells += reader->consume(rec) ? 1 : 0;
    }
    INFO("message " << i);
    REQUIRE(got == sent[i]);
  }
  producer.join();
  RingRecord rec{};
  CHECK_FALSE(reader->next(rec, why));
  CHECK(why.empty());
  CHECK(bells > 0);  // the 300 KiB messages filled the 64 KiB ring
}

TEST_CASE("message ring: the reader refuses what a broken writer left", "[ring]") {
  std::string why;
  auto reader = SharedRing::create(64 << 10, true, why);
  REQUIRE(reader != nullptr);
  auto writer = map_of(*reader);
  const char msg[] = "hello";
  uint64_t done = 0;
  REQUIRE(writer->write(msg, sizeof(msg), done));
  REQUIRE(done == sizeof(msg));

  RingRecord rec{};
  SECTION("a tail beyond the capacity") {
    reader->control().tail.store(uint64_t{1} << 40);
    CHECK_FALSE(reader->next(rec, why));
    CHECK(why.find("tail") != std::string::npos);
  }
  SECTION("a tail that is not record-aligned") {
    reader->control().tail.store(17);
    CHECK_FALSE(reader->next(rec, why));
    CHECK_FALSE(why.empty());
  }
  SECTION("a record longer than what was written") {
    RingRecord bad{1000, hmc_net::kRingFirst, 1000};
    // The data area follows the control block, 64-byte aligned.
    char* data = reinterpret_cast<char*>(&reader->control()) + (sizeof(hmc_net::RingControl) + 63) / 64 * 64;
    std::memcpy(data, &bad, sizeof(bad));
    CHECK_FALSE(reader->next(rec, why));
    CHECK(why.find("overruns") != std::string::npos);
  }
  SECTION("an intact record reads back") {
    REQUIRE(reader->next(rec, why));
    CHECK(rec.len == sizeof(msg));
    CHECK(rec.total == sizeof(msg));
    char out[sizeof(msg)] = {};
    reader->copy(0, out, rec.len);
    CHECK(std::memcmp(out, msg, sizeof(msg)) == 0);
  }
}

TEST_CASE("message ring: only a ring of this version maps; idle readers are seen", "[ring]") {
  std::string why;
  const int fd = memfd_create("not-a-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 1 << 20) == 0);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  // A file its owner could still shrink is refused whatever it holds: a write through the
  // mapping after a shrink would die of SIGBUS.
  hmc_net::RingOffer offer{fd, 1 << 20, 0, 0};
  CHECK(SharedRing::map(path, offer, why) == nullptr);
  CHECK(why.find("not sealed") != std::string::npos);
  REQUIRE(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK(SharedRing::map(path, offer, why) == nullptr);
  CHECK(why.find("no message ring") != std::string::npos);
  offer.bytes = 4096;
  CHECK(SharedRing::map(path, offer, why) == nullptr);
  close(fd);

  auto reader = SharedRing::create(1, true, why);  // rounded up to the minimum
  REQUIRE(reader != nullptr);
  // The ring it offers cannot change size, so a peer may map it.
  const int offered = static_cast<int>(reader->offer().fd);
  CHECK((fcntl(offered, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW));
  CHECK(ftruncate(offered, 4096) != 0);
  CHECK(reader->max_record() >= (64u << 10) - sizeof(RingRecord));
  auto writer = map_of(*reader);
  const int64_t now = SharedRing::now_ns();
  CHECK(writer->reader_idle(now));  // never polled
  reader->stamp_polling(now);
  CHECK_FALSE(writer->reader_idle(now + 1000));
  CHECK(writer->reader_idle(now + 2 * SharedRing::kIdleNs));
}

// The offerer may close the connection, and its fd then name another ring, before the peer
// opens /proc/<pid>/fd/<fd>: that ring must not be taken for the one offered.
TEST_CASE("message ring: an offer maps only the very ring it was made for", "[ring]") {
  std::string why;
  auto first = SharedRing::create(64 << 10, true, why);
  auto second = SharedRing::create(64 << 10, true, why);
  REQUIRE(first != nullptr);
  REQUIRE(second != nullptr);
  CHECK(first->offer().nonce != 0);
  CHECK(first->offer().nonce != second->offer().nonce);
  hmc_net::RingOffer stale = first->offer();
  stale.fd = second->offer().fd;  // as if the first ring's fd had been reused for the second
  const std::string path = "/proc/self/fd/" + std::to_string(stale.fd);
  CHECK(SharedRing::map(path, stale, why) == nullptr);
  CHECK(why.find("another message ring") != std::string::npos);
  CHECK(SharedRing::map(path, second->offer(), why) != nullptr);
}

TEST_CASE("message ring: put marks, and a closed ring lets no put step begin", "[ring][put]") {
  std::string why;
  auto reader = SharedRing::create(64 << 10, false, why);
  REQUIRE(reader != nullptr);
  auto writer = map_of(*reader);
  CHECK_FALSE(writer->carries_messages());  // HMC_SHM_RING=0: marks only
  CHECK(reader->put_region() == 0);
  REQUIRE(writer->put_begin(7));
  CHECK(reader->put_region() == 8);
  writer->put_end();
  CHECK(reader->put_region() == 0);

  REQUIRE(writer->put_begin(0));
  CHECK(reader->shut_puts());  // a step under way
  writer->put_end();
  CHECK_FALSE(writer->put_begin(3));
  CHECK(reader->put_region() == 0);
  CHECK_FALSE(reader->shut_puts());
}

namespace {

std::vector<std::string> fence_logs;

hmc_net::Host test_host() {
  hmc_host_services_t services{};
  services.struct_size = sizeof(services);
  services.log = [](void*, int, const char*, const char* message) { fence_logs.emplace_back(message); };
  return hmc_net::Host(services, "test");
}

}  // namespace

TEST_CASE("put fence: a deregistration waits for the put step into its region only", "[ring][put]") {
  std::string why;
  auto open_ring = std::shared_ptr<SharedRing>(SharedRing::create(64 << 10, true, why));
  auto closed_ring = std::shared_ptr<SharedRing>(SharedRing::create(64 << 10, true, why));
  REQUIRE(open_ring != nullptr);
  REQUIRE(closed_ring != nullptr);
  auto open_writer = map_of(*open_ring);
  auto closed_writer = map_of(*closed_ring);
  hmc_net::Host host = test_host();
  hmc_net::PutFence fence;
  const pid_t self = getpid();

  // Another region's step does not hold the deregistration up.
  REQUIRE(open_writer->put_begin(5));
  const auto t0 = std::chrono::steady_clock::now();
  fence.wait(4, {{open_ring, self}}, host);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));

  // Its own does, until the step ends.
  std::atomic<bool> ended{false};
  std::thread step([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ended = true;
    open_writer->put_end();
  });
  fence.wait(5, {{open_ring, self}}, host);
  CHECK(ended.load());
  step.join();

  // A ring closed during a step is kept for it; one closed without a step is not.
  REQUIRE(closed_writer->put_begin(9));
  fence.closed({closed_ring, self});
  std::atomic<bool> closed_ended{false};
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    closed_ended = true;
    closed_writer->put_end();
  });
  fence.wait(9, {}, host);
  CHECK(closed_ended.load());
  late.join();
  CHECK_FALSE(closed_writer->put_begin(9));  // nothing new begins after the close
  CHECK(fence_logs.empty());
}

TEST_CASE("put fence: a writer that died in its step is not waited for, unreaped or not", "[ring][put]") {
  std::string why;
  auto ring = std::shared_ptr<SharedRing>(SharedRing::create(64 << 10, true, why));
  REQUIRE(ring != nullptr);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the mapping is shared with the parent: mark a step and die in it
    ring->put_begin(2);
    _exit(0);
  }
  struct Reap {
    pid_t pid;
    ~Reap() { waitpid(pid, nullptr, 0); }
  } reap{child};
  // Left a zombie: the parent has not reaped it yet.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  siginfo_t info{};
  while (std::chrono::steady_clock::now() < deadline &&
         (waitid(P_PID, child, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != child))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(info.si_pid == child);
  REQUIRE(ring->put_region() == 3);
  hmc_net::Host host = test_host();
  hmc_net::PutFence fence;
  const auto t0 = std::chrono::steady_clock::now();
  fence.wait(2, {{ring, child}}, host);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
  CHECK(fence_logs.empty());
}

// The put fence stops waiting for a writer that is gone. A process whose main thread left
// by pthread_exit shows as a zombie while its other threads still run (and may copy a put
// step): that one is not gone until its last thread is.
TEST_CASE("put fence: a process whose main thread left while another runs is not gone", "[ring][put]") {
  int ends[2];
  REQUIRE(pipe(ends) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ends[1]);
    std::thread([fd = ends[0]] {  // lives until the parent closes its end of the pipe
      char c;
      while (read(fd, &c, 1) > 0) {
      }
      _exit(0);
    }).detach();
    syscall(SYS_exit, 0);  // this thread alone, without unwinding into Catch (pthread_exit would)
  }
  close(ends[0]);
  struct Reap {  // however the checks end: the child exits and is reaped
    pid_t pid;
    int fd;
    ~Reap() {
      if (fd >= 0) close(fd);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{child, ends[1]};
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the main thread has left
  CHECK_FALSE(hmc_net::process_gone(child));
  close(reap.fd);  // the remaining thread ends the process
  reap.fd = -1;
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    gone = hmc_net::process_gone(child);  // a zombie, not reaped yet
  }
  CHECK(gone);
}
