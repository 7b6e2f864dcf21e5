// Eager flow control (core/eager_credit.cpp), in real processes over every net provider.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

constexpr std::size_t kHeader = 40;  // what each eager message counts besides its bytes
constexpr uint64_t kDataTag = 3, kGoTag = 4;

// HMC_CREDIT_WAIT stays unset unless `credit_wait` is given.
std::map<std::string, std::string> over(const std::string& provider, const std::string& window,
                                        const std::string& credit_wait = "") {
  std::map<std::string, std::string> env = {{"HMC_PROVIDERS", "cpu," + provider}, {"HMC_TIMEOUT", "30s"},
                                            {"HMC_EAGER_LIMIT", "4K"}, {"HMC_EAGER_WINDOW", window}};
  if (!credit_wait.empty()) env["HMC_CREDIT_WAIT"] = credit_wait;
  return env;
}

// Rank 0 sends `count` messages of `bytes` (tag kDataTag, message k seeded with k + seed)
// while rank 1 posts no receive. Returns the index of the first send that
// was still pending 1 s after it was posted (count when every one completed on its own
// within 5 s), or -1 on a failed check. 1 s, not less: a provider thread that a loaded host
// descheduled must not make an early send look like the one past the window. `sends` keeps the requests.
int sends_until_one_waits(RankEnv& e, int count, std::size_t bytes, uint64_t seed,
                          std::vector<std::vector<uint8_t>>& out, std::vector<Request>& sends) {
  int first_waiting = count;
  for (int k = 0; k < count; ++k) {
    out.push_back(test::random_bytes(bytes, seed + k));
    sends.push_back(e.comm.isend(out.back().data(), bytes, 1, kDataTag));
    if (first_waiting < count) continue;  // past the window: no more waits of 1 s each
    const Status early = sends.back().wait(std::chrono::milliseconds(k == 0 ? 5000 : 1000));
    if (early.ok()) continue;
    if (early.code() != ErrorCode::kTimeout) {
      std::fprintf(stderr, "send %d failed: %s\n", k, early.to_string().c_str());
      return -1;
    }
    first_waiting = k;
  }
  return first_waiting;
}

// Rank 1: the go, then `count` messages in order, each checked.
int receive_in_order(RankEnv& e, int count, std::size_t bytes, uint64_t seed) {
  char go = 0;
  HMC_EXPECT_OK(e.comm.recv(&go, 1, 0, kGoTag));
  for (int k = 0; k < count; ++k) {
    std::vector<uint8_t> got(bytes, 0xA5);
    HMC_EXPECT_OK(e.comm.recv(got.data(), bytes, 0, kDataTag));
    HMC_EXPECT(got == test::random_bytes(bytes, seed + k), "message " + std::to_string(k) + " differs");
  }
  return 0;
}

// Both ranks: the pair's window is `window`; rank 0 sends `count` messages of `bytes`
// before rank 1 receives any, and the first of them to wait must be `want_waiting`
// (`count`: none waits); rank 1 then receives and checks them all.
int window_holds(RankEnv& e, std::size_t window, std::size_t bytes, int count, int want_waiting, uint64_t seed) {
  const std::size_t got = e.comm.path(1 - e.rank).eager_window;
  HMC_EXPECT(got == window, "eager window " + std::to_string(got) + ", expected " + std::to_string(window));
  if (e.rank == 1) return receive_in_order(e, count, bytes, seed);
  std::vector<std::vector<uint8_t>> out;
  std::vector<Request> sends;
  const int first_waiting = sends_until_one_waits(e, count, bytes, seed, out, sends);
  HMC_EXPECT(first_waiting == want_waiting, "send " + std::to_string(first_waiting) + " was the first to wait, expected " +
                                                std::to_string(want_waiting));
  char go = 1;
  HMC_EXPECT_OK(e.comm.send(&go, 1, 1, kGoTag));
  HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
  return 0;
}

}  // namespace

// A sender that runs ahead of a receiver that posts no receive: exactly the window's worth
// of eager messages completes on its own, the next waits for the receiver (rendezvous), and
// every message arrives intact and in order. Once the receiver has caught up, the credit is
// back and sends complete on their own again: every rendezvous send of the first round
// completed after the receiver consumed the eager ones, and the credit came back ahead of
// their answers on the same connection.
TEST_CASE("an eager sender a window ahead of its receiver waits for it and nothing is lost", "[p2p][flow]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider, "32K"), [](RankEnv& e) {
        constexpr std::size_t kBytes = 2000, kWindow = 32768;
        const int fit = static_cast<int>(kWindow / (kBytes + kHeader));  // 16
        HMC_EXPECT(e.comm.path(1 - e.rank).eager_limit == 4096, "eager limit is not HMC_EAGER_LIMIT");
        if (int rc = window_holds(e, kWindow, kBytes, fit + 8, fit, 100)) return rc;
        return window_holds(e, kWindow, kBytes, fit / 2, fit / 2, 200);
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// Unbounded: 64 messages (256 KB) all complete on their own. Raised to four messages of the
// eager limit with their headers: four of 4000 B fit, the fifth waits.
TEST_CASE("HMC_EAGER_WINDOW=0 lets eager sends run ahead without bound and a small one is raised", "[p2p][flow]") {
  for (const auto& provider : test::available_net_providers()) {
    for (const std::string window : {"0", "1K"}) {
      DYNAMIC_SECTION(provider << ", HMC_EAGER_WINDOW=" << window) {
        auto exits = test::run_ranks(2, over(provider, window), [window](RankEnv& e) {
          if (window == "0") return window_holds(e, SIZE_MAX, 4000, 64, 64, 300);
          return window_holds(e, 4 * (4096 + kHeader), 4000, 5, 4, 300);
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

// Unset, the window is 256 KiB between ranks of one host and 1 MiB between hosts (two
// "hosts" by HMC_HOST_ID), and at least sixteen times the pair's eager limit: shm on one
// host (16 KiB advised) 256 KiB, tcp on one host (64 KiB) 1 MiB; the credit wait is 0 on
// one host and 200 us between hosts. Set, each holds for every pair. Then a window's worth
// of 16000 B sends completes before the receiver posts anything, and the next waits.
TEST_CASE("the eager window and credit wait default by pair class unless set", "[p2p][flow]") {
  struct Case {
    const char* name;
    std::map<std::string, std::string> env;
    std::size_t window;
    int64_t wait_us;
  };
  const std::vector<Case> cases = {
      {"one host, shm", {}, 256u << 10, 0},
      {"one host, tcp", {{"HMC_PATH", "tcp"}}, 1u << 20, 0},
      {"two hosts, tcp", {{"HMC_HOST_ID", "host{rank}"}}, 1u << 20, 200},
      {"one host, shm, set", {{"HMC_EAGER_WINDOW", "512K"}, {"HMC_CREDIT_WAIT", "3ms"}}, 512u << 10, 3000},
      {"two hosts, tcp, set", {{"HMC_HOST_ID", "host{rank}"}, {"HMC_EAGER_WINDOW", "512K"}, {"HMC_CREDIT_WAIT", "3ms"}},
       512u << 10, 3000},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto env = c.env;
      env.insert({{"HMC_PROVIDERS", "cpu,shm,tcp"}, {"HMC_TIMEOUT", "30s"}});
      auto exits = test::run_ranks(2, env, [&c](RankEnv& e) {
        const int64_t wait_us = e.comm.path(1 - e.rank).credit_wait.count();
        HMC_EXPECT(wait_us == c.wait_us, "credit wait " + std::to_string(wait_us) + " us, expected " +
                                             std::to_string(c.wait_us));
        constexpr std::size_t kBytes = 16000;
        const int fit = static_cast<int>(c.window / (kBytes + kHeader));
        return window_holds(e, c.window, kBytes, fit + 1, fit, 400);
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// Three ranks, each sending every other rank messages of mixed sizes (empty ones too) under
// a small window before receiving any, so eager and rendezvous messages interleave on each
// pair: each arrives intact, in the order sent.
TEST_CASE("eager and rendezvous messages interleaved by the window keep their order and bytes", "[p2p][flow]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(3, over(provider, "16K"), [](RankEnv& e) {
        constexpr int kCount = 60;
        auto size_of = [](int k) { return static_cast<std::size_t>(k % 7 == 0 ? 0 : (k * 613) % 6000); };
        auto seed_of = [](int from, int to, int k) { return static_cast<uint64_t>((from * 10 + to) * 1000 + k); };
        std::vector<std::vector<uint8_t>> out;
        std::vector<Request> sends;
        for (int peer = 0; peer < e.size; ++peer) {
          if (peer == e.rank) continue;
          for (int k = 0; k < kCount; ++k) {
            out.push_back(test::random_bytes(size_of(k), seed_of(e.rank, peer, k)));
            sends.push_back(e.comm.isend(out.back().data(), out.back().size(), peer, kDataTag));
          }
        }
        for (int peer = 0; peer < e.size; ++peer) {
          if (peer == e.rank) continue;
          for (int k = 0; k < kCount; ++k) {
            std::vector<uint8_t> got(size_of(k), 0x5A);
            HMC_EXPECT_OK(e.comm.recv(got.data(), got.size(), peer, kDataTag));
            HMC_EXPECT(got == test::random_bytes(size_of(k), seed_of(peer, e.rank, k)),
                       "message " + std::to_string(k) + " from rank " + std::to_string(peer) + " differs");
          }
        }
        HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// With a long HMC_CREDIT_WAIT, the send past the window waits for credit: once the receiver
// has taken the window's messages (the barrier tells it the send is waiting), that send
// goes eagerly and completes before its own receive is posted. With HMC_CREDIT_WAIT=0 it
// went by rendezvous at once and waits for its receive.
TEST_CASE("a send short of eager credit goes eagerly once the credit comes back", "[p2p][flow]") {
  for (const auto& provider : test::available_net_providers()) {
    for (const std::string wait : {"20s", "0"}) {
      DYNAMIC_SECTION(provider << ", HMC_CREDIT_WAIT=" << wait) {
        auto exits = test::run_ranks(2, over(provider, "32K", wait), [wait](RankEnv& e) {
          constexpr std::size_t kBytes = 2000;
          const int fit = static_cast<int>(32768 / (kBytes + kHeader));
          if (e.rank == 1) {
            HMC_EXPECT_OK(e.comm.barrier());  // rank 0's last send waits
            for (int k = 0; k < fit; ++k) {
              std::vector<uint8_t> got(kBytes);
              HMC_EXPECT_OK(e.comm.recv(got.data(), kBytes, 0, kDataTag));
              HMC_EXPECT(got == test::random_bytes(kBytes, 500 + k), "message " + std::to_string(k) + " differs");
            }
            HMC_EXPECT_OK(e.comm.barrier());  // rank 0 saw how its last send ended
            std::vector<uint8_t> last(kBytes);
            HMC_EXPECT_OK(e.comm.recv(last.data(), kBytes, 0, kDataTag));
            HMC_EXPECT(last == test::random_bytes(kBytes, 500 + fit), "the last message differs");
            return 0;
          }
          std::vector<std::vector<uint8_t>> out;
          std::vector<Request> sends;
          HMC_EXPECT(sends_until_one_waits(e, fit + 1, kBytes, 500, out, sends) == fit, "the window did not hold");
          HMC_EXPECT_OK(e.comm.barrier());
          const Status last = sends.back().wait(std::chrono::milliseconds(wait == "0" ? 1000 : 10000));
          if (wait == "0") HMC_EXPECT(last.code() == ErrorCode::kTimeout, "completed before its receive: " + last.to_string());
          else HMC_EXPECT_OK(last);
          HMC_EXPECT_OK(e.comm.barrier());
          HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
          return 0;
        });
        INFO(test::describe(exits));
        REQUIRE(test::all_ok(exits));
      }
    }
  }
}

// A receiver that first waits for a message sent after the window filled, under another
// tag, consumes nothing that would give credit back: the held send goes by rendezvous once
// HMC_CREDIT_WAIT has passed, and the sends queued behind it keep their order.
TEST_CASE("a send held for credit goes by rendezvous after HMC_CREDIT_WAIT and keeps its place", "[p2p][flow]") {
  for (const auto& provider : test::available_net_providers()) {
    DYNAMIC_SECTION(provider) {
      auto exits = test::run_ranks(2, over(provider, "32K", "100ms"), [](RankEnv& e) {
        constexpr std::size_t kBytes = 2000;
        constexpr uint64_t kOtherTag = 9;
        const int fit = static_cast<int>(32768 / (kBytes + kHeader)), after = 3;
        if (e.rank == 1) {
          std::vector<uint8_t> got(kBytes);
          HMC_EXPECT_OK(e.comm.recv(got.data(), kBytes, 0, kOtherTag));
          HMC_EXPECT(got == test::random_bytes(kBytes, 9999), "the held message differs");
          for (int k = 0; k < fit + after; ++k) {
            HMC_EXPECT_OK(e.comm.recv(got.data(), kBytes, 0, kDataTag));
            HMC_EXPECT(got == test::random_bytes(kBytes, 700 + k), "message " + std::to_string(k) + " differs");
          }
          return 0;
        }
        std::vector<std::vector<uint8_t>> out;
        std::vector<Request> sends;
        auto send = [&](uint64_t tag, uint64_t seed) {
          out.push_back(test::random_bytes(kBytes, seed));
          sends.push_back(e.comm.isend(out.back().data(), kBytes, 1, tag));
        };
        for (int k = 0; k < fit; ++k) send(kDataTag, 700 + k);
        send(kOtherTag, 9999);
        for (int k = fit; k < fit + after; ++k) send(kDataTag, 700 + k);
        HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// A send waiting for credit ends with the communicator: abort fails it at once.
TEST_CASE("abort fails a send that waits for eager credit", "[p2p][flow]") {
  auto exits = test::run_ranks(2, over("tcp", "32K", "60s"), [](RankEnv& e) {
    constexpr std::size_t kBytes = 2000;
    const int fit = static_cast<int>(32768 / (kBytes + kHeader));
    if (e.rank == 1) {
      uint8_t none = 0;
      Status s = e.comm.recv(&none, 1, 0, kGoTag);
      HMC_EXPECT(s.code() == ErrorCode::kPeerLost || s.code() == ErrorCode::kAborted, s.to_string());
      e.comm.abort();  // the job is over: no finalize with a peer gone
      return 0;
    }
    std::vector<std::vector<uint8_t>> out;
    std::vector<Request> sends;
    HMC_EXPECT(sends_until_one_waits(e, fit + 1, kBytes, 800, out, sends) == fit, "the window did not hold");
    const auto t0 = std::chrono::steady_clock::now();
    e.comm.abort();
    const Status s = sends.back().wait(std::chrono::milliseconds(5000));
    HMC_EXPECT(s.code() == ErrorCode::kAborted, s.to_string());
    HMC_EXPECT(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2), "the held send outlived the abort");
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}
