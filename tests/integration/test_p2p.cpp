// Point-to-point over every available net provider, in real processes.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <deque>
#include <thread>
#include <filesystem>
#include <fstream>

#include "eager_check.h"
#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

std::map<std::string, std::string> over(const std::string& provider) {
  return {{"HMC_PROVIDERS", "cpu," + provider}, {"HMC_TIMEOUT", "30s"}};
}

// Rank 0 sends `bytes` of random data to rank 1, which sends it back; both check.
int ping_pong(RankEnv& e, std::size_t bytes, uint64_t seed) {
  auto payload = test::random_bytes(bytes, seed);
  std::vector<uint8_t> got(bytes, 0xA5);  // poisoned
  if (e.rank == 0) {
    HMC_EXPECT_OK(e.comm.send(payload.data(), bytes, 1, 7));
    HMC_EXPECT_OK(e.comm.recv(got.data(), bytes, 1, 8));
  } else {
    HMC_EXPECT_OK(e.comm.recv(got.data(), bytes, 0, 7));
    HMC_EXPECT(got == payload, "rank 1 received wrong data");
    HMC_EXPECT_OK(e.comm.send(got.data(), bytes, 0, 8));
  }
  HMC_EXPECT(got == payload, "data differs after the round trip of " + std::to_string(bytes) + " bytes");
  return 0;
}

// Sends this rank's key for `mr` to `peer` and takes the peer's (the same size) into `theirs`.
Status swap_keys(RankEnv& e, const MemoryRegion& mr, int peer, uint64_t tag, RemoteKey& theirs) {
  auto mine = mr.pack();
  theirs.bytes.assign(mine.bytes.size(), 0);
  Request rk = e.comm.irecv(theirs.bytes.data(), theirs.bytes.size(), peer, tag);
  if (Status s = e.comm.send(mine.bytes.data(), mine.bytes.size(), peer, tag); !s.ok()) return s;
  return rk.wait();
}

}  // namespace

TEST_CASE("send/recv moves every size intact over each provider", "[p2p]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [&provider](RankEnv& e) {
        const PathInfo& path = e.comm.path(1 - e.rank);
        HMC_EXPECT(path.provider == provider, "path is " + path.provider + ", expected " + provider);
        HMC_EXPECT(!path.reason.empty() && !path.candidates.empty(), "path has no reason or candidates");
        const std::size_t eager = path.eager_limit;  // the last eager size and the first rendezvous
        const std::size_t sizes[] = {0, 1, 4095, eager, eager + 1, 64 << 10, (64 << 10) + 1, 1 << 20, 16 << 20, 256u << 20};
        uint64_t seed = 1;
        for (std::size_t n : sizes)
          if (int rc = ping_pong(e, n, seed++)) return rc;
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// Each pair's eager limit is HMC_EAGER_LIMIT or the provider's lower advice (tcp gives none,
// shm 16 KiB; ucx's depends on its transports: tests/ucx), and a HMC_EAGER_LIMIT the user
// set holds for every provider. The engine keeps to it: a send of the limit completes
// before its receive is posted, one byte more waits for the receiver (rendezvous).
TEST_CASE("the eager limit of a pair is the provider's advice unless HMC_EAGER_LIMIT is set", "[p2p][eager]") {
  const std::map<std::string, std::size_t> advised = {{"shm", 16u << 10}, {"tcp", 64u << 10}};
  for (const auto& provider : test::available_net_providers()) {
    for (const bool user_limit : {false, true}) {
      DYNAMIC_SECTION(provider << (user_limit ? ", HMC_EAGER_LIMIT=48K" : "")) {
        auto settings = over(provider);
        if (user_limit) settings["HMC_EAGER_LIMIT"] = "48K";
        const auto known = advised.find(provider);
        const std::size_t want = user_limit ? 48u << 10 : known != advised.end() ? known->second : 0;
        auto exits = test::run_ranks(2, settings, [want](RankEnv& e) {
          const std::size_t limit = e.comm.path(1 - e.rank).eager_limit;
          HMC_EXPECT(want == 0 || limit == want, "eager limit " + std::to_string(limit) + ", want " + std::to_string(want));
          for (const std::size_t bytes : {limit, limit + 1})
            if (int rc = test::check_send_before_receive(e, bytes, bytes <= limit)) return rc;
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

TEST_CASE("messages match by tag, in order, expected or not", "[p2p]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(3, over(provider), [](RankEnv& e) {
        // Every rank sends two messages per tag to every rank (itself too) before receiving,
        // so most arrive unexpected; tags are received in the reverse order of sending.
        constexpr int kTags = 3;
        const std::size_t sizes[] = {24, 200 << 10};
        std::vector<std::vector<uint8_t>> out;
        std::vector<Request> sends;
        for (int peer = 0; peer < e.size; ++peer)
          for (int tag = 0; tag < kTags; ++tag)
            for (int k = 0; k < 2; ++k) {
              uint64_t seed = (e.rank * 100 + peer) * 100 + tag * 10 + k;
              out.push_back(test::random_bytes(sizes[k], seed));
              sends.push_back(e.comm.isend(out.back().data(), sizes[k], peer, tag));
            }
        for (int peer = 0; peer < e.size; ++peer)
          for (int tag = kTags - 1; tag >= 0; --tag)
            for (int k = 0; k < 2; ++k) {
              std::vector<uint8_t> got(sizes[k], 0x5A);
              HMC_EXPECT_OK(e.comm.recv(got.data(), got.size(), peer, tag));
              uint64_t seed = (peer * 100 + e.rank) * 100 + tag * 10 + k;
              HMC_EXPECT(got == test::random_bytes(sizes[k], seed), "wrong data from rank " + std::to_string(peer));
            }
        HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// A send to this rank itself is eager at any size (communicator.h): with no receive posted
// it completes at once and its message waits; a posted receive that does not fit fails,
// and the send with it. 16 B and 1 MiB, the receive posted before and after.
TEST_CASE("a send to this rank itself follows the eager rule at any size", "[p2p][self]") {
  auto exits = test::run_ranks(2, over("tcp"), [](RankEnv& e) {
    uint64_t tag = 40;
    for (const std::size_t n : {std::size_t{16}, std::size_t{1} << 20}) {
      const auto msg = test::random_bytes(n, n);
      std::vector<uint8_t> small(n / 2), whole(n);
      // Receive first, too small: both fail.
      Request r = e.comm.irecv(small.data(), small.size(), e.rank, tag);
      Status sent = e.comm.isend(msg.data(), n, e.rank, tag).wait();
      HMC_EXPECT(sent.code() == ErrorCode::kMismatch, std::to_string(n) + " B, posted: " + sent.to_string());
      HMC_EXPECT(r.wait().code() == ErrorCode::kMismatch, std::to_string(n) + " B, posted receive");
      ++tag;
      // Send first: it completes; a receive that does not fit fails, one that fits takes it.
      HMC_EXPECT_OK(e.comm.isend(msg.data(), n, e.rank, tag).wait());
      HMC_EXPECT(e.comm.recv(small.data(), small.size(), e.rank, tag).code() == ErrorCode::kMismatch,
                 std::to_string(n) + " B, late receive");
      HMC_EXPECT_OK(e.comm.isend(msg.data(), n, e.rank, ++tag).wait());
      HMC_EXPECT_OK(e.comm.recv(whole.data(), n, e.rank, tag));
      HMC_EXPECT(whole == msg, std::to_string(n) + " B differs");
      ++tag;
    }
    HMC_EXPECT_OK(e.comm.finalize());
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

TEST_CASE("finalize refuses a rendezvous send that arrives while it waits for the others", "[p2p]") {
  // Rank 1 posts a receive too small for rank 0's rendezvous send and finalizes at once,
  // so the send reaches it only during finalize's barrier. Rank 1 must still refuse it
  // there: rank 0's send then fails with kMismatch and both leave well before HMC_TIMEOUT
  // (before, rank 0's finalize waited the whole timeout for an answer).
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto env = over(provider);
      env["HMC_TIMEOUT"] = "20s";
      auto exits = test::run_ranks(2, env, [](RankEnv& e) {
        const auto start = std::chrono::steady_clock::now();
        std::vector<uint8_t> buf(e.rank == 0 ? (1 << 20) : 16, 0x5A);
        if (e.rank == 0) usleep(300000);
        Request r = e.rank == 0 ? e.comm.isend(buf.data(), buf.size(), 1, 7) : e.comm.irecv(buf.data(), buf.size(), 0, 7);
        HMC_EXPECT_OK(e.comm.finalize());
        const Status got = r.wait(std::chrono::seconds(1));
        HMC_EXPECT(got.code() == ErrorCode::kMismatch, "expected kMismatch, got " + got.to_string());
        const auto took = std::chrono::steady_clock::now() - start;
        HMC_EXPECT(took < std::chrono::seconds(10), "finalize took " +
                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) + " ms");
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// barrier() runs over the control plane, but a peer may need this rank's answer before it
// reaches the barrier: here rank 1's blocking rendezvous send needs rank 0's CTS, while
// rank 0 has posted its receive and sits in barrier(). barrier() made no progress, so
// both waited until HMC_TIMEOUT and failed with kTimeout.
TEST_CASE("barrier answers peers while it waits", "[p2p][barrier]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto env = over(provider);
      env["HMC_TIMEOUT"] = "8s";
      auto exits = test::run_ranks(2, env, [](RankEnv& e) {
        const auto start = std::chrono::steady_clock::now();
        const auto sent = test::random_bytes(4 << 20, 77);
        std::vector<uint8_t> got(sent.size(), 0);
        if (e.rank == 0) {
          Request r = e.comm.irecv(got.data(), got.size(), 1, 5);
          HMC_EXPECT_OK(e.comm.barrier());
          HMC_EXPECT_OK(r.wait());
          HMC_EXPECT(got == sent, "rank 0 received wrong data");
        } else {
          HMC_EXPECT_OK(e.comm.send(sent.data(), sent.size(), 0, 5));
          HMC_EXPECT_OK(e.comm.barrier());
        }
        const auto took = std::chrono::steady_clock::now() - start;
        HMC_EXPECT(took < std::chrono::seconds(7), "took " +
                   std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) + " ms");
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

TEST_CASE("many small messages in flight at once each keep their own bytes", "[p2p]") {
  // More eager sends than core keeps wire buffers for (32), all posted before the peer
  // receives any: a buffer taken again while its send is still queued would show here.
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        constexpr int kMessages = 100;
        auto size_of = [](int k) { return std::size_t{1000} + 97 * static_cast<std::size_t>(k); };
        const int peer = 1 - e.rank;
        std::vector<std::vector<uint8_t>> out;
        std::vector<Request> sends;
        for (int k = 0; k < kMessages; ++k) out.push_back(test::random_bytes(size_of(k), e.rank * 1000 + k));
        for (int k = 0; k < kMessages; ++k) sends.push_back(e.comm.isend(out[k].data(), out[k].size(), peer, k));
        for (int k = kMessages - 1; k >= 0; --k) {
          std::vector<uint8_t> got(size_of(k), 0x5A);
          HMC_EXPECT_OK(e.comm.recv(got.data(), got.size(), peer, k));
          HMC_EXPECT(got == test::random_bytes(size_of(k), peer * 1000 + k), "wrong data in message " + std::to_string(k));
        }
        HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

TEST_CASE("put writes into a peer's region and notifies it", "[put]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        const std::size_t region_bytes = 64u << 20;
        std::vector<uint8_t> region(region_bytes, 0xEE);
        auto mr = e.comm.register_memory(region.data(), region.size());
        HMC_EXPECT(mr.ok(), mr.status().to_string());
        int peer = 1 - e.rank;
        RemoteKey key;
        HMC_EXPECT_OK(swap_keys(e, *mr, peer, 1, key));  // each rank learns the other's region
        const std::pair<std::size_t, std::size_t> writes[] = {{0, 1}, {4096, 3000}, {1 << 20, 8 << 20}, {region_bytes - 100, 100}, {17, 0}};
        uint64_t n = 0;
        for (auto [off, len] : writes) {
          auto data = test::random_bytes(len, 1000 + e.rank * 10 + n);
          HMC_EXPECT_OK(e.comm.put(peer, data.data(), len, key, off, n).wait());
          auto v = e.comm.wait_notify(peer);
          HMC_EXPECT(v.ok() && v.value() == n, "notification " + std::to_string(n) + " missing or wrong");
          auto want = test::random_bytes(len, 1000 + peer * 10 + n);
          HMC_EXPECT(len == 0 || std::memcmp(region.data() + off, want.data(), len) == 0, "put data wrong at offset " + std::to_string(off));
          ++n;
        }
        // Bytes nobody wrote keep their poison.
        HMC_EXPECT(region[2] == 0xEE && region[(1 << 20) - 1] == 0xEE && region[region_bytes - 101] == 0xEE, "put wrote outside its range");
        Status oob = e.comm.put(peer, region.data(), 200, key, region_bytes - 100).wait();
        HMC_EXPECT(oob.code() == ErrorCode::kOutOfBounds, oob.to_string());
        return e.comm.barrier().ok() ? 0 : 1;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// A put the target refuses after the provider took it (tcp and ucx check keys at the
// target) fails at the initiator, and its notification must not reach the target: a
// NOTIFY there would announce data that never came. Later notifications keep their order.
TEST_CASE("a refused put notifies nobody; later notifications keep their order", "[put]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        const int peer = 1 - e.rank;
        const std::size_t n = 64 * 1024;
        std::vector<uint8_t> gone_buf(n), live_buf(n, 0xEE);
        auto gone = e.comm.register_memory(gone_buf.data(), n);
        auto live = e.comm.register_memory(live_buf.data(), n);
        HMC_EXPECT(gone.ok() && live.ok(), "registration failed");
        RemoteKey stale, key;
        HMC_EXPECT_OK(swap_keys(e, *gone, peer, 1, stale));
        HMC_EXPECT_OK(swap_keys(e, *live, peer, 2, key));
        *gone = MemoryRegion();  // deregistered: its key is stale from here on
        HMC_EXPECT_OK(e.comm.barrier());
        if (e.rank == 0) {
          auto data = test::random_bytes(n, 42);
          // Three puts in flight at once: the refused one between two good ones.
          Request first = e.comm.put(peer, data.data(), n / 2, key, 0, 8);
          Request refused = e.comm.put(peer, data.data(), n, stale, 0, 7);
          Request last = e.comm.put(peer, data.data() + n / 2, n / 2, key, n / 2, 9);
          HMC_EXPECT_OK(first.wait());
          Status s = refused.wait();
          HMC_EXPECT(!s.ok(), "a put with a deregistered region's key succeeded");
          HMC_EXPECT_OK(last.wait());
          HMC_EXPECT_OK(e.comm.send(nullptr, 0, peer, 3));
        } else {
          for (uint64_t want : {8, 9}) {
            auto v = e.comm.wait_notify(peer);
            HMC_EXPECT(v.ok() && v.value() == want, "expected notification " + std::to_string(want) + ", got " +
                                                         (v.ok() ? std::to_string(v.value()) : v.status().to_string()));
          }
          HMC_EXPECT(live_buf == test::random_bytes(n, 42), "notified puts' data wrong");
          HMC_EXPECT_OK(e.comm.recv(nullptr, 0, peer, 3));  // every put has ended at the initiator
          auto extra = e.comm.wait_notify(peer, std::chrono::milliseconds(200));
          HMC_EXPECT(extra.status().code() == ErrorCode::kTimeout,
                     "the refused put's notification arrived: " + (extra.ok() ? std::to_string(extra.value()) : extra.status().to_string()));
        }
        return e.comm.barrier().ok() ? 0 : 1;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// memory_region.h: destroying a region returns once no byte of a put lands there any more,
// so the memory may be reused at once. Rank 0 keeps two 16 MiB puts in flight into rank 1's
// region; rank 1 destroys it after two have landed, overwrites the memory as its next user
// would and watches it for 20 ms. In processes, so shm's two copies (process_vm_writev into
// heap memory, memcpy into mapped shareable memory) both run; before put_fence.h up to
// 4 MiB landed after the destroy. ucx over shm copies into shareable memory through its
// mapping too: before the answered revoke (docs/ucx.md) the copy's last 64 bytes landed.
TEST_CASE("no byte of a put lands after its region was destroyed", "[put][revoked]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        constexpr std::size_t kLen = 16u << 20;
        constexpr uint8_t kReused = 0x5a;
        for (int round = 0; round < 6; ++round) {
          const bool shareable = round % 2 == 1;
          if (e.rank == 1) {
            std::vector<uint8_t> heap;
            Memory mem;
            uint8_t* buf;
            if (shareable) {
              auto m = e.ctx.alloc({"cpu", 0}, kLen, AllocKind::kShareable);
              HMC_EXPECT(m.ok(), m.status().to_string());
              mem = std::move(m.value());
              buf = static_cast<uint8_t*>(mem.data());
            } else {
              heap.assign(kLen, 0);
              buf = heap.data();
            }
            auto mr = e.comm.register_memory(buf, kLen);
            HMC_EXPECT(mr.ok(), mr.status().to_string());
            const RemoteKey key = mr->pack();
            const uint64_t key_len = key.bytes.size();
            HMC_EXPECT_OK(e.comm.send(&key_len, sizeof(key_len), 0, 20));
            HMC_EXPECT_OK(e.comm.send(key.bytes.data(), key_len, 0, 21));
            for (int i = 0; i < 2; ++i) HMC_EXPECT(e.comm.wait_notify(0).ok(), "a put did not land");
            *mr = MemoryRegion();
            std::memset(buf, kReused, kLen);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::size_t changed = 0;
            for (std::size_t i = 0; i < kLen; ++i) changed += buf[i] != kReused;
            HMC_EXPECT(changed == 0, "round " + std::to_string(round) + (shareable ? " (shareable)" : " (heap)") +
                                         ": " + std::to_string(changed) + " bytes changed after the destroy");
            HMC_EXPECT_OK(e.comm.send(nullptr, 0, 0, 22));  // rank 0 may stop
            while (e.comm.wait_notify(0, std::chrono::milliseconds(0)).ok()) {
            }
            continue;
          }
          uint64_t key_len = 0;
          HMC_EXPECT_OK(e.comm.recv(&key_len, sizeof(key_len), 1, 20));
          RemoteKey key;
          key.bytes.resize(key_len);
          HMC_EXPECT_OK(e.comm.recv(key.bytes.data(), key_len, 1, 21));
          const auto src = test::random_bytes(kLen, 900 + round);
          Request stop = e.comm.irecv(nullptr, 0, 1, 22);
          std::deque<Request> in_flight;
          bool refused = false;
          for (uint64_t n = 0; !stop.test();) {
            if (!refused && in_flight.size() < 2) {
              in_flight.push_back(e.comm.put(1, src.data(), kLen, key, 0, n++));
              continue;
            }
            if (in_flight.empty()) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
              continue;
            }
            Status s = in_flight.front().wait();
            in_flight.pop_front();
            if (!s.ok()) {
              HMC_EXPECT(s.code() == ErrorCode::kOutOfBounds, "put after the destroy: " + s.to_string());
              refused = true;
            }
          }
          for (Request& r : in_flight) (void)r.wait();
          HMC_EXPECT_OK(stop.wait());
        }
        return e.comm.barrier().ok() ? 0 : 1;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

TEST_CASE("receives into HMC memory reuse registrations, and a free flushes them", "[p2p][regcache]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        const std::size_t n = 1u << 20;
        uint64_t seed = 77;
        for (int round = 0; round < 3; ++round) {
          // A fresh allocation each round: after a free the same address may come back,
          // possibly backed by different memory; the cached registration must not survive.
          auto mem = e.ctx.alloc({"cpu", 0}, n, round == 1 ? AllocKind::kDefault : AllocKind::kShareable);
          HMC_EXPECT(mem.ok(), mem.status().to_string());
          for (int k = 0; k < 3; ++k, ++seed) {
            auto want = test::random_bytes(n, seed);
            if (e.rank == 0) {
              HMC_EXPECT_OK(e.comm.send(want.data(), n, 1, 3));
            } else {
              std::memset(mem->data(), 0xAB, n);
              HMC_EXPECT_OK(e.comm.recv(mem->data(), n, 0, 3));
              HMC_EXPECT(std::memcmp(mem->data(), want.data(), n) == 0, "round " + std::to_string(round));
            }
          }
        }
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

namespace {
std::size_t entries(const char* dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}
// Shared mappings ("rw-s"): a sanitizer's allocator moves the count of private ones.
std::size_t shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string range, perms, rest; maps >> range >> perms && std::getline(maps, rest);) n += perms[3] == 's';
  return n;
}
}  // namespace

// Each unique id starts a bootstrap root (a thread, a listening socket, its connections),
// which the context kept until its end: a process that made communicators in a loop (a
// split per step) ran out of descriptors. Roots of jobs that are over now go.
TEST_CASE("communicators made one after another do not pile up bootstrap roots", "[p2p][lifetime]") {
  auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,tcp"}, {"HMC_TIMEOUT", "10s"}}});
  REQUIRE(ctx.ok());
  auto one = [&](bool finalize) {
    auto comm = Communicator::create(ctx.value(), ctx->create_unique_id().value(), 0, 1);
    REQUIRE(comm.ok());
    if (finalize) REQUIRE(comm->finalize().ok());
  };
  one(true);  // the first makes what stays (provider threads, listeners)
  const std::size_t threads = entries("/proc/self/task"), fds = entries("/proc/self/fd");
  for (int i = 0; i < 40; ++i) one(i % 2 == 0);  // finalized, or only destroyed
  const std::size_t threads_after = entries("/proc/self/task"), fds_after = entries("/proc/self/fd");
  INFO("threads " << threads << " -> " << threads_after << ", descriptors " << fds << " -> " << fds_after);
  CHECK(threads_after <= threads + 2);
  CHECK(fds_after <= fds + 8);
}

// Communicators between the same two ranks, one after another, each finalized or only
// destroyed: none may leave a connection behind (ucx kept a transport socket of each on
// both sides while its flushing close waited for a connection that never ended), nor
// memory mapped (ucx over shared memory alone kept an endpoint of each, which mapped the
// peer's segments again: 2-3 mappings per communicator).
TEST_CASE("two-rank communicators made one after another leave no connections behind", "[p2p][lifetime]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider), [](RankEnv& e) {
        auto one = [&](int i) -> int {
          char text[256] = {};
          if (e.rank == 0) std::snprintf(text, sizeof(text), "%s", e.ctx.create_unique_id().value().to_string().c_str());
          if (e.rank == 0) HMC_EXPECT_OK(e.comm.send(text, sizeof(text), 1, 5));
          else HMC_EXPECT_OK(e.comm.recv(text, sizeof(text), 0, 5));
          auto c = Communicator::create(e.ctx, UniqueId::parse(text).value(), e.rank, 2);
          HMC_EXPECT_OK(c.status());
          int64_t out = e.rank + 10 * i, in = -1;
          Request r = c->irecv(&in, sizeof(in), 1 - e.rank, 1);
          HMC_EXPECT_OK(c->send(&out, sizeof(out), 1 - e.rank, 1));
          HMC_EXPECT_OK(r.wait());
          HMC_EXPECT(in == 1 - e.rank + 10 * i, "received " + std::to_string(in));
          std::vector<uint8_t> big(1 << 20, static_cast<uint8_t>(i)), back(1 << 20);  // by rendezvous
          Request rb = c->irecv(back.data(), back.size(), 1 - e.rank, 2);
          HMC_EXPECT_OK(c->send(big.data(), big.size(), 1 - e.rank, 2));
          HMC_EXPECT_OK(rb.wait());
          HMC_EXPECT(back == big, "the rendezvous message");
          if (i % 2 == 0) HMC_EXPECT_OK(c->finalize());
          else HMC_EXPECT_OK(e.comm.barrier());  // both done with it before it goes
          return 0;
        };
        if (int rc = one(0)) return rc;  // the first makes what stays
        const std::size_t fds = entries("/proc/self/fd"), maps = shared_mappings();
        for (int i = 1; i <= 16; ++i)
          if (int rc = one(i)) return rc;
        const std::size_t fds_after = entries("/proc/self/fd"), maps_after = shared_mappings();
        // Slack for the bootstrap root of the last id (about 4 descriptors), which may still
        // be up at the second count and gone at the first: one left per communicator is 16.
        HMC_EXPECT(fds_after <= fds + 8, "descriptors " + std::to_string(fds) + " -> " + std::to_string(fds_after));
        HMC_EXPECT(maps_after <= maps + 2, "shared mappings " + std::to_string(maps) + " -> " + std::to_string(maps_after));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}
