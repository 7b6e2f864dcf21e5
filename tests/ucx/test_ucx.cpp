// ucx-specific behaviour, in real processes: progress while the target is
// outside HMC, path negotiation against tcp and shm, host memory from ucx's
// mem_alloc, and a UCX that cannot start. Each case runs over the transports in UCX_TLS_LIST (tcp and shm).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "eager_check.h"
#include "harness.h"
#include "lifeline.h"
#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;
using ucx_test::ucx_missing;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<std::string> kTransports = {"tcp", "shm"};

// `bytes` at `base` registered, and the packed keys swapped with the other of two ranks.
struct Swapped {
  MemoryRegion mine;  // keep it while puts may land
  RemoteKey theirs;
};
Result<Swapped> register_and_swap_keys(RankEnv& e, void* base, std::size_t bytes, uint64_t tag) {
  auto mr = e.comm.register_memory(base, bytes);
  if (!mr) return mr.status();
  auto key = mr->pack();
  std::vector<uint8_t> theirs(key.bytes.size());
  const int peer = 1 - e.rank;
  Request rk = e.comm.irecv(theirs.data(), theirs.size(), peer, tag);
  HMC_RETURN_IF_ERROR(e.comm.send(key.bytes.data(), key.bytes.size(), peer, tag));
  HMC_RETURN_IF_ERROR(rk.wait());
  return Swapped{std::move(mr.value()), RemoteKey{std::move(theirs)}};
}

const PathCandidate* candidate(const PathInfo& path, const std::string& name) {
  for (const auto& c : path.candidates)
    if (c.provider == name) return &c;
  return nullptr;
}

}  // namespace

// UCX emulates a put into malloc'd memory over shared memory with active
// messages the target must progress, and a put as an active message of our own
// (HMC_UCX_PUT=am, what tcp uses) needs the target too; the provider's thread
// does that, so the target may be asleep outside every HMC call. The put must
// also complete well before the target wakes.
TEST_CASE("ucx: a put completes while the target sleeps outside HMC", "[ucx][put]") {
  if (ucx_missing()) return;
  for (const auto& tls : kTransports) {
    for (const std::string mode : {"am", "rma"}) {
      DYNAMIC_SECTION("UCX transports " << tls << ", HMC_UCX_PUT=" << mode) {
        std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"},
                                             {"HMC_UCX_TLS", tls},
                                             {"HMC_UCX_PUT", mode},
                                             {"HMC_TIMEOUT", "30s"}};
        auto exits = test::run_ranks(2, s, [](RankEnv& e) {
          const std::size_t bytes = 16u << 20;
          std::vector<uint8_t> region(bytes, 0xEE);
          auto keys = register_and_swap_keys(e, region.data(), region.size(), 1);
          HMC_EXPECT(keys.ok(), keys.status().to_string());
          const int peer = 1 - e.rank;
          HMC_EXPECT_OK(e.comm.barrier());
          if (e.rank == 1) {
            std::this_thread::sleep_for(std::chrono::seconds(6));  // no HMC call at all
            char done = 0;
            HMC_EXPECT_OK(e.comm.recv(&done, 1, 0, 2));
            auto want = test::random_bytes(bytes - 4096, 77);
            HMC_EXPECT(std::memcmp(region.data() + 4096, want.data(), want.size()) == 0, "put data wrong");
            HMC_EXPECT(region[4095] == 0xEE, "put wrote before its offset");
            return 0;
          }
          auto data = test::random_bytes(bytes - 4096, 77);
          auto t0 = Clock::now();
          // Well before the target wakes, with room for a loaded host (a sanitizer, CI).
          HMC_EXPECT_OK(e.comm.put(peer, data.data(), data.size(), keys->theirs, 4096).wait(std::chrono::seconds(5)));
          auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
          HMC_EXPECT(took < 5000, "put took " + std::to_string(took) + " ms: the target's worker was not progressed");
          char done = 1;
          HMC_EXPECT_OK(e.comm.send(&done, 1, 1, 2));
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

// Over shared memory a put into the target's mem_alloc memory is a copy through the
// initiator's mapping, done within the call, while one into its heap goes as an active
// message the target lands. A NOTIFY follows its put in put order all the same: the one
// of a copy done at once waits behind the NOTIFY of an earlier put still landing.
TEST_CASE("ucx: a put done at once notifies after an earlier put still landing", "[ucx][put][notify]") {
  if (ucx_missing()) return;
  std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_UCX_TLS", "shm"}, {"HMC_TIMEOUT", "30s"}};
  auto exits = test::run_ranks(2, s, [](RankEnv& e) {
    const std::size_t heap_bytes = 8u << 20, mapped_bytes = 1u << 20;
    std::vector<uint8_t> heap(heap_bytes, 0xEE);
    auto mapped = e.ctx.alloc({"cpu", 0}, mapped_bytes, AllocKind::kShareable);
    HMC_EXPECT(mapped.ok(), mapped.status().to_string());
    auto* mapped_base = static_cast<uint8_t*>(mapped->data());
    std::memset(mapped_base, 0xEE, mapped_bytes);
    auto to_heap = register_and_swap_keys(e, heap.data(), heap_bytes, 1);
    auto to_mapped = register_and_swap_keys(e, mapped_base, mapped_bytes, 2);
    HMC_EXPECT(to_heap.ok() && to_mapped.ok(), "registration failed");
    const auto big = test::random_bytes(heap_bytes, 31), small = test::random_bytes(mapped_bytes / 2, 32);
    if (e.rank == 0) {
      // Both keys checked by the target first, so the second put below is a copy at once.
      HMC_EXPECT_OK(e.comm.put(1, small.data(), 64, to_mapped->theirs, 0).wait());
      HMC_EXPECT_OK(e.comm.put(1, small.data(), 64, to_heap->theirs, 0).wait());
      for (uint64_t round = 0; round < 4; ++round) {
        Request landing = e.comm.put(1, big.data(), big.size(), to_heap->theirs, 0, 2 * round + 1);
        Request at_once = e.comm.put(1, small.data(), small.size(), to_mapped->theirs, 4096, 2 * round + 2);
        HMC_EXPECT_OK(landing.wait());
        HMC_EXPECT_OK(at_once.wait());
      }
    } else {
      for (uint64_t want = 1; want <= 8; ++want) {
        auto v = e.comm.wait_notify(0);
        HMC_EXPECT(v.ok() && v.value() == want, "expected notification " + std::to_string(want) + ", got " +
                                                     (v.ok() ? std::to_string(v.value()) : v.status().to_string()));
        if (want % 2 == 1)
          HMC_EXPECT(std::memcmp(heap.data(), big.data(), heap_bytes) == 0, "the heap put's data is not all there at its notification");
        else
          HMC_EXPECT(std::memcmp(mapped_base + 4096, small.data(), small.size()) == 0 && mapped_base[4095] == 0xEE,
                     "the mapped put's data is not there at its notification");
      }
    }
    return e.comm.barrier().ok() ? 0 : 1;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// A put sent as an active message lands in the region on the target's side, so
// deregistering the region must wait for a put already landing, or the memory
// could be written after the application freed it. The target unmaps the region
// right after deregistering it: a write after that kills it. The put itself either
// landed (dereg waited) or was refused (it came after the dereg).
TEST_CASE("ucx: deregistering a region waits for a put landing in it", "[ucx][put][dereg]") {
  if (ucx_missing()) return;
  for (const auto& tls : kTransports) {
    DYNAMIC_SECTION("UCX transports " << tls) {
      std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"},
                                           {"HMC_UCX_TLS", tls},
                                           {"HMC_UCX_PUT", "am"},
                                           {"HMC_TIMEOUT", "30s"}};
      auto exits = test::run_ranks(2, s, [](RankEnv& e) {
        const std::size_t bytes = 64u << 20;
        const int peer = 1 - e.rank;
        if (e.rank == 0) {
          void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          HMC_EXPECT(mem != MAP_FAILED, "mmap failed");
          std::memset(mem, 0xEE, bytes);
          int32_t code = -1;
          {
            auto mr = e.comm.register_memory(mem, bytes);
            HMC_EXPECT(mr.ok(), mr.status().to_string());
            auto key = mr->pack();
            const uint64_t len = key.bytes.size();
            HMC_EXPECT_OK(e.comm.send(&len, sizeof len, peer, 1));
            HMC_EXPECT_OK(e.comm.send(key.bytes.data(), len, peer, 1));
            char go = 0;
            HMC_EXPECT_OK(e.comm.recv(&go, 1, peer, 2));
          }  // deregistered here, with the put on its way or landing
          munmap(mem, bytes);
          HMC_EXPECT_OK(e.comm.recv(&code, sizeof code, peer, 3));
          HMC_EXPECT(code == static_cast<int32_t>(ErrorCode::kOk) || code == static_cast<int32_t>(ErrorCode::kOutOfBounds),
                     "put ended with code " + std::to_string(code));
          return 0;
        }
        uint64_t len = 0;
        HMC_EXPECT_OK(e.comm.recv(&len, sizeof len, peer, 1));
        std::vector<uint8_t> key(len);
        HMC_EXPECT_OK(e.comm.recv(key.data(), len, peer, 1));
        auto data = test::random_bytes(bytes, 5);
        // A first small put has the key checked, so the big one goes at once.
        HMC_EXPECT_OK(e.comm.put(peer, data.data(), 64, RemoteKey{key}, 0).wait());
        char go = 1;
        HMC_EXPECT_OK(e.comm.send(&go, 1, peer, 2));
        Status put = e.comm.put(peer, data.data(), bytes, RemoteKey{key}, 0).wait(std::chrono::seconds(20));
        const auto code = static_cast<int32_t>(put.code());
        HMC_EXPECT_OK(e.comm.send(&code, sizeof code, peer, 3));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// While the host polls, the provider's thread looks at it only every 100 us to 1 ms and
// leaves the worker to it. A waiter that finds nothing tells the provider it stops polling
// before it sleeps (idle, net.h; core/progress.h): that must hand the worker back to the
// thread at once, or a message arriving in the next millisecond waits for the waiter's
// own timeout. After each busy phase (2000 ping-pongs) rank 1 sends 200 to 1000 us late:
// during rank 0's spin, its first sleep, or a later one. On the 2-vCPU VM, in 1200 rounds
// (six runs), 1192 took 4-176 us from send to return and 8, sent 700 or 1000 us late,
// 267-477 us (never two in one section of 25).
// With an unannounced first sleep of 200 us instead of idle, a message landing in it waited
// for its end: 10 rounds in 600 took 250-407 us (the median at 400 us late over shm
// 114-125 us in two runs), and on CI 8 of 25 at 700 us late failed this case; without any
// hand-over 4 to 8 rounds in 15 took 185-900 us. At most 4 of 25 rounds may take 250 us or more
// (scheduling outliers: a concurrent multi-process test made 3 in 15); this case runs
// alone (tests/ucx/CMakeLists.txt). Every round's time is printed.
TEST_CASE("ucx: a waiter that fell asleep after a busy phase wakes when the message comes", "[ucx][timing]") {
  if (ucx_missing()) return;
  auto now_us = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  };
  for (const auto& tls : kTransports) {
    for (int late_us : {200, 400, 700, 1000}) {
      DYNAMIC_SECTION("UCX transports " << tls << ", sent " << late_us << " us late") {
        std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_UCX_TLS", tls}, {"HMC_TIMEOUT", "30s"}};
        auto exits = test::run_ranks(2, s, [&](RankEnv& e) {
          const int peer = 1 - e.rank;
          std::vector<int64_t> took;
          for (int round = 0; round < 25; ++round) {
            uint64_t v = 0;
            for (int i = 0; i < 2000; ++i) {
              if (e.rank == 0) HMC_EXPECT_OK(e.comm.send(&v, 8, peer, 5));
              HMC_EXPECT_OK(e.comm.recv(&v, 8, peer, 5));
              if (e.rank == 1) HMC_EXPECT_OK(e.comm.send(&v, 8, peer, 5));
            }
            int64_t sent = 0;  // steady_clock is one clock for every process of the host
            if (e.rank == 1) {
              std::this_thread::sleep_for(std::chrono::microseconds(late_us));
              sent = now_us();
              HMC_EXPECT_OK(e.comm.send(&sent, sizeof(sent), peer, 6));
              continue;
            }
            HMC_EXPECT_OK(e.comm.recv(&sent, sizeof(sent), peer, 6));
            took.push_back(now_us() - sent);
          }
          if (e.rank == 1) return 0;
          std::sort(took.begin(), took.end());
          std::string all;
          for (int64_t t : took) all += " " + std::to_string(t);
          std::printf("[timing] %s late %d:%s\n", tls.c_str(), late_us, all.c_str());
          std::fflush(stdout);
          const auto slow = std::count_if(took.begin(), took.end(), [](int64_t t) { return t >= 250; });
          HMC_EXPECT(slow <= 4, "rank 0 returned this many us after rank 1 sent:" + all);
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

namespace {

// Voluntary context switches of this process's ucx provider thread ("hmc-ucx"): each time
// it sleeps in epoll or blocks on a mutex.
long ucx_thread_voluntary_switches() {
  long sum = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(task.path() / "status");
    bool ours = false;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Name:", 0) == 0) ours = line.find("hmc-ucx") != std::string::npos;
      if (ours && line.rfind("voluntary_ctxt_switches:", 0) == 0) sum += std::stol(line.substr(24));
    }
  }
  return sum;
}

}  // namespace

// A put into memory the initiator maps over shared memory is a memcpy under the provider's
// lock. The provider thread must not take that busy host for one that stopped: it then
// blocked on the lock during every put, and each put's unlock paid a futex wake (4 MiB put
// stream 58 against 66 GB/s with the fix, on two cores). That happened where a put takes
// about as long as the thread's idea of a host that stopped (kLinger, 100 us), and where a
// progress pass copied a large put's fragments for that long; the sizes here span that on
// any memory from 20 to 160 GB/s. Counted, not timed: the thread's own looks (at most one
// per ms once it backs off) stay well below one per put, a thread waiting on the lock makes
// one per put. Runs alone (tests/ucx/CMakeLists.txt).
TEST_CASE("ucx: the provider thread leaves a host that copies puts alone", "[ucx][timing]") {
  if (ucx_missing()) return;
  std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_UCX_TLS", "shm"}, {"HMC_TIMEOUT", "30s"}};
  auto exits = test::run_ranks(2, s, [](RankEnv& e) {
    constexpr std::size_t kMax = 16u << 20;
    constexpr int kPutsPerSize = 100;
    auto mem = e.ctx.alloc({"cpu", 0}, kMax, AllocKind::kShareable);  // ucx's mem_alloc: mapped by the peer
    HMC_EXPECT(mem.ok(), mem.status().to_string());
    auto* base = static_cast<uint8_t*>(mem->data());
    auto keys = register_and_swap_keys(e, base, kMax, 1);
    HMC_EXPECT(keys.ok(), keys.status().to_string());
    const RemoteKey& theirs = keys->theirs;
    const int peer = 1 - e.rank;
    auto data = test::random_bytes(kMax, 1);
    if (e.rank == 0) HMC_EXPECT_OK(e.comm.put(peer, data.data(), kMax, theirs, 0).wait());  // key checked
    auto last = test::random_bytes(kMax, 7);  // the final put's bytes, checked by the target
    // Three rounds, each a busy phase (both hosts poll, so the thread watches from afar; in
    // its armed sleep it would never look at the host during the puts) and then, on rank 0,
    // a stream of puts. The median round is judged: one round the scheduler spoils (a rank
    // off its core looks like a host that stopped) does not fail the case.
    constexpr int kRounds = 3;
    std::vector<long> switches, allowed;
    std::string seen;
    for (int round = 0; round < kRounds; ++round) {
      uint64_t v = 0;
      for (int i = 0; i < 2000; ++i) {
        if (e.rank == 0) HMC_EXPECT_OK(e.comm.send(&v, 8, peer, 3));
        HMC_EXPECT_OK(e.comm.recv(&v, 8, peer, 3));
        if (e.rank == 1) HMC_EXPECT_OK(e.comm.send(&v, 8, peer, 3));
      }
      if (e.rank == 1) continue;
      const long before = ucx_thread_voluntary_switches();
      const auto t0 = Clock::now();
      int puts = 0;
      for (std::size_t bytes = 2u << 20; bytes <= kMax; bytes *= 2) {
        std::vector<Request> window;
        for (int i = 0; i < kPutsPerSize; ++i, ++puts) {
          if (window.size() == 4) {
            HMC_EXPECT_OK(window.front().wait());
            window.erase(window.begin());
          }
          window.push_back(e.comm.put(peer, data.data(), bytes, theirs, 0));
        }
        for (auto& r : window) HMC_EXPECT_OK(r.wait());
      }
      switches.push_back(ucx_thread_voluntary_switches() - before);
      const long ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
      // The thread's looks: about one per ms, and a few before its back-off reaches 1 ms.
      allowed.push_back(puts / 8 + ms + 20);
      seen += " " + std::to_string(puts) + " puts in " + std::to_string(ms) + " ms: " + std::to_string(switches.back()) +
              " switches (allowed " + std::to_string(allowed.back()) + ");";
    }
    if (e.rank == 1) {
      char done = 0;
      HMC_EXPECT_OK(e.comm.recv(&done, 1, 0, 2));
      HMC_EXPECT(std::memcmp(base, last.data(), kMax) == 0, "put data differs");
      return 0;
    }
    HMC_EXPECT_OK(e.comm.put(peer, last.data(), kMax, theirs, 0).wait());
    char done = 1;
    HMC_EXPECT_OK(e.comm.send(&done, 1, 1, 2));
    int over = 0;
    for (int round = 0; round < kRounds; ++round) over += switches[round] > allowed[round];
    HMC_EXPECT(over <= kRounds / 2, "voluntary switches of the ucx thread over put streams of 2-16 MiB:" + seen);
    std::printf("ucx put streams:%s\n", seen.c_str());
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

TEST_CASE("ucx: loses to shm on one host, beats nothing it should not, and can be forced", "[ucx][path]") {
  if (ucx_missing()) return;
  for (const auto& tls : kTransports) {
    for (const std::string forced : {"", "ucx"}) {
      DYNAMIC_SECTION("UCX transports " << tls << (forced.empty() ? "" : ", HMC_PATH=ucx")) {
        std::map<std::string, std::string> s{{"HMC_UCX_TLS", tls}, {"HMC_TIMEOUT", "30s"}};
        if (!forced.empty()) s["HMC_PATH"] = forced;
        auto exits = test::run_ranks(2, s, [forced](RankEnv& e) {
          const PathInfo& path = e.comm.path(1 - e.rank);
          const PathCandidate* ucx = candidate(path, "ucx");
          HMC_EXPECT(ucx != nullptr, "no ucx candidate: " + path.reason);
          HMC_EXPECT(ucx->usable, "ucx not usable: " + ucx->reason);
          const std::string want = forced.empty() ? "shm" : "ucx";
          HMC_EXPECT(path.provider == want, "chose " + path.provider + ": " + path.reason);
          // Data moves over the chosen path, eager and rendezvous.
          for (std::size_t bytes : {std::size_t{8}, std::size_t{4} << 20}) {
            auto data = test::random_bytes(bytes, bytes);
            std::vector<uint8_t> got(bytes, 0);
            if (e.rank == 0) {
              HMC_EXPECT_OK(e.comm.send(data.data(), bytes, 1, 3));
            } else {
              HMC_EXPECT_OK(e.comm.recv(got.data(), bytes, 0, 3));
              HMC_EXPECT(got == data, "data differs");
            }
          }
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

// Over shared memory ucx advises rendezvous past 32 KiB (a put into the receiver's buffer
// beats an active message in 8 KiB fragments); over tcp it gives no advice, and a
// HMC_EAGER_LIMIT the user set wins over the advice. What decides is visible: an eager
// send completes before its receive is posted, a rendezvous send waits for the receiver.
TEST_CASE("ucx: the eager limit follows ucx's advice per transport unless HMC_EAGER_LIMIT is set", "[ucx][eager]") {
  if (ucx_missing()) return;
  // "tcp,shm" is UCX's default on this machine: with tcp there, every endpoint is a tcp
  // one (PEER mode leaves posix and sysv out), so there is no shared-memory advice.
  for (const std::string tls : {"tcp", "shm", "tcp,shm"}) {
    for (const bool user_limit : {false, true}) {
      for (const bool from_alloc : {true, false}) {
        const std::size_t want = tls == "shm" && !user_limit ? 32u << 10 : 64u << 10;
        DYNAMIC_SECTION("UCX transports " << tls << (user_limit ? ", HMC_EAGER_LIMIT=64K" : "")
                                          << (from_alloc ? ", Context::alloc" : ", malloc")) {
          std::map<std::string, std::string> s{{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_UCX_TLS", tls}, {"HMC_TIMEOUT", "30s"}};
          if (user_limit) s["HMC_EAGER_LIMIT"] = "64K";
          auto exits = test::run_ranks(2, s, [want, from_alloc](RankEnv& e) {
            const int peer = 1 - e.rank;
            HMC_EXPECT(e.comm.path(peer).eager_limit == want,
                       "eager limit " + std::to_string(e.comm.path(peer).eager_limit) + ", want " + std::to_string(want));
            for (const std::size_t bytes : {std::size_t{32} << 10, std::size_t{48} << 10}) {
              Memory mem;  // rank 1 receives into ucx's mem_alloc memory or the heap
              if (from_alloc && e.rank == 1) {
                auto m = e.ctx.alloc({"cpu", 0}, bytes);
                HMC_EXPECT(m.ok(), m.status().to_string());
                mem = std::move(m.value());
              }
              auto* into = static_cast<uint8_t*>(mem.data());  // null: the heap
              if (int rc = test::check_send_before_receive(e, bytes, bytes <= want, into)) return rc;
            }
            return 0;
          });
          INFO(test::describe(exits));
          REQUIRE(test::all_ok(exits));
        }
      }
    }
  }
}

namespace {

// The /proc/self/maps line of the mapping that holds `p` ("" when none does).
std::string mapping_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && lo <= addr && addr < hi) return line;
  }
  return "";
}

}  // namespace

// Host memory from Context::alloc comes from ucx's mem_alloc (ucp_mem_map
// ALLOCATE) when every pair uses ucx, and from the cpu provider (a memfd
// named hmc-cpu-* for shareable memory) otherwise. Either way a rendezvous
// receive into a range of it (registered inside the allocation) and a put
// into all of it land exactly.
TEST_CASE("ucx: Context::alloc takes host memory from ucx when every pair uses it", "[ucx][alloc]") {
  if (ucx_missing()) return;
  struct Case {
    std::map<std::string, std::string> settings;
    bool from_ucx;
  };
  for (const auto& tls : kTransports) {
    for (const auto& [settings, from_ucx] :
         {Case{{{"HMC_PROVIDERS", "cpu,ucx"}}, true}, Case{{{"HMC_PATH", "ucx"}}, true}, Case{{}, false}}) {
      DYNAMIC_SECTION("UCX transports " << tls << ", " << (settings.empty() ? "default" : settings.begin()->first)) {
        auto s = settings;
        s["HMC_UCX_TLS"] = tls;
        s["HMC_TIMEOUT"] = "30s";
        auto exits = test::run_ranks(2, s, [from_ucx](RankEnv& e) {
          const std::size_t bytes = 8u << 20, off = 12345, len = 4u << 20;
          auto mem = e.ctx.alloc({"cpu", 0}, bytes, AllocKind::kShareable);
          HMC_EXPECT(mem.ok(), mem.status().to_string());
          auto* base = static_cast<uint8_t*>(mem->data());
          const std::string where = mapping_of(base);
          const bool cpu_memfd = where.find("memfd:hmc-cpu-") != std::string::npos;
          HMC_EXPECT(cpu_memfd != from_ucx, "allocation lies in '" + where + "'");
          std::memset(base, 0xEE, bytes);
          auto want = test::random_bytes(len, 91);
          if (e.rank == 0) {
            HMC_EXPECT_OK(e.comm.send(want.data(), len, 1, 5));
          } else {
            HMC_EXPECT_OK(e.comm.recv(base + off, len, 0, 5));
            HMC_EXPECT(std::memcmp(base + off, want.data(), len) == 0, "rendezvous data differs");
            HMC_EXPECT(base[off - 1] == 0xEE && base[off + len] == 0xEE, "receive wrote outside its range");
          }
          auto keys = register_and_swap_keys(e, base, bytes, 6);
          HMC_EXPECT(keys.ok(), keys.status().to_string());
          auto put = test::random_bytes(bytes - 64, 92);
          if (e.rank == 0) HMC_EXPECT_OK(e.comm.put(1, put.data(), put.size(), keys->theirs, 64).wait());
          HMC_EXPECT_OK(e.comm.barrier());
          if (e.rank == 1) {
            HMC_EXPECT(std::memcmp(base + 64, put.data(), put.size()) == 0, "put data differs");
            HMC_EXPECT(base[63] == 0xEE, "put wrote before its offset");
          }
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

TEST_CASE("ucx: a UCX that cannot start is unavailable with its reason; tcp and shm work", "[ucx][unavailable]") {
  {  // gone before the ranks fork: a child must not inherit a live context's threads
    auto ctx = Context::create({{{"HMC_UCX_TLS", "nonsense"}}});
    REQUIRE(ctx.ok());
    bool listed = false, others = false;
    for (const auto& p : ctx->providers()) {
      if (p.name == "ucx") {
        listed = true;
        INFO(p.reason);
        CHECK_FALSE(p.available);
        CHECK(p.reason.find("ucp_init") != std::string::npos);
      }
      others |= (p.name == "shm" || p.name == "tcp") && p.available;
    }
    if (!listed) WARN("libhmc-net-ucx.so was not found: nothing to check but the others");
    REQUIRE(others);
  }
  auto exits = test::run_ranks(2, {{"HMC_UCX_TLS", "nonsense"}, {"HMC_TIMEOUT", "30s"}}, [](RankEnv& e) {
    HMC_EXPECT(e.comm.path(1 - e.rank).provider != "ucx", "ucx chosen although unavailable");
    std::vector<uint8_t> data = test::random_bytes(1 << 20, 5), got(1 << 20, 0);
    if (e.rank == 0) HMC_EXPECT_OK(e.comm.send(data.data(), data.size(), 1, 4));
    else HMC_EXPECT_OK(e.comm.recv(got.data(), got.size(), 0, 4));
    HMC_EXPECT(e.rank == 0 || got == data, "data differs");
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// ucx moves everything in the host's calls while the host polls (its thread takes the
// worker over only after), so it says HMC_NET_CAP_POLLED: waiters on its paths need no CPU
// kept free for it (core/progress.h). tcp and shm carry messages on io threads and do not.
TEST_CASE("ucx: says its messages move in the host's calls; tcp and shm do not", "[ucx][caps]") {
  auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,tcp,shm,ucx"}}});
  REQUIRE(ctx.ok());
  int seen = 0;
  for (const auto& p : ctx->providers()) {
    if (p.kind != "net" || !p.available) continue;
    INFO(p.name);
    const bool polled = std::find(p.cap_names.begin(), p.cap_names.end(), "polled") != p.cap_names.end();
    CHECK(polled == ((p.caps & HMC_NET_CAP_POLLED) != 0));
    CHECK(polled == (p.name == "ucx"));
    ++seen;
  }
  CHECK(seen == (ucx_missing() ? 2 : 3));
}

// The lifeline handshake carries a version: a peer whose ucx speaks another wire
// protocol (version 1 left puts by active message unanswered) is refused with both
// versions named, not left to time out.
TEST_CASE("ucx: the lifeline handshake round-trips and refuses another version", "[ucx][handshake]") {
  hmc_ucx::Handshake h;
  h.conn = 7;
  h.cookie = 0x1122334455667788ull;
  h.hello = {'h', 'i'};
  h.worker = {1, 2, 3, 4, 5};
  const std::string bytes = hmc_ucx::encode(h);
  hmc_ucx::Handshake got;
  std::size_t used = 0;
  std::string why;
  REQUIRE(hmc_ucx::decode(bytes.substr(0, 10), 64, got, used, why) == 1);  // more bytes needed
  REQUIRE(hmc_ucx::decode(bytes, 64, got, used, why) == 0);
  CHECK(used == bytes.size());
  CHECK(got.conn == 7);
  CHECK(got.cookie == h.cookie);
  CHECK(got.hello == h.hello);
  CHECK(got.worker == h.worker);

  std::string old = bytes;
  const uint32_t v1 = 1;
  std::memcpy(old.data() + 4, &v1, sizeof v1);  // the version field follows the magic
  CHECK(hmc_ucx::decode(old, 64, got, used, why) < 0);
  CHECK(why.find("version 1 from the peer, " + std::to_string(hmc_ucx::kHandshakeVersion) + " here") != std::string::npos);
  std::string stranger = bytes;
  stranger[0] ^= 0x5a;
  CHECK(hmc_ucx::decode(stranger, 64, got, used, why) < 0);
  CHECK(why == "not an HMC ucx handshake");
}
