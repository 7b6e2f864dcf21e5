// The split rendezvous over ucx (core/rndv_split.cpp): between ranks of one host, from
// HMC_RNDV_SPLIT up, the sender puts the first half of a message while the receiver gets
// the second; where the receiver's get is refused, the sender puts that half too.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <thread>

#include "harness.h"
#include "multiprocess.h"
#include "rndv_support.h"

using namespace hmc;
using hmc::test::RankEnv;
using ucx_test::over_ucx;
using ucx_test::round_trips;
using ucx_test::SharedFlag;
using ucx_test::ucx_missing;

namespace {

std::size_t head_of(std::size_t bytes) { return (bytes / 2) & ~std::size_t{63}; }

}  // namespace

// Rank 0 posts its send and stays out of HMC. Rank 1's receive cannot end without rank 0's
// half, but its own half arrives meanwhile: after a second the buffer holds the message's
// second half and still the fill in its first. Then rank 0 comes back and both end with the
// whole message. Below the split size the receiver gets all of it alone; the RTS reaching
// rank 1 before its receive (the unexpected path) splits the same way.
TEST_CASE("ucx: a split rendezvous: the receiver gets its half while the sender is away", "[ucx][rndv][split]") {
  if (ucx_missing()) return;
  SharedFlag flag;
  auto exits = test::run_ranks(2, over_ucx("shm"), [&flag](RankEnv& e) {
    const int peer = 1 - e.rank;
    const std::size_t from = e.comm.path(peer).split_from;
    HMC_EXPECT(from == (128u << 10), "split from " + std::to_string(from));
    HMC_EXPECT(e.comm.path(peer).get_limit > from, "get limit " + std::to_string(e.comm.path(peer).get_limit));
    struct Case { std::size_t bytes; bool unexpected; };
    const Case cases[] = {{from - 1, false}, {from, false}, {(1u << 20) + 3, false}, {(4u << 20) + 5, true}};
    int round = 0;
    for (auto [bytes, unexpected] : cases) {
      const bool split = bytes >= from;
      auto mem = e.ctx.alloc({"cpu", 0}, bytes);
      HMC_EXPECT_OK(mem.status());
      auto* buf = static_cast<uint8_t*>(mem->data());
      const auto payload = test::random_bytes(bytes, 90 + round);
      const std::string what = std::to_string(bytes) + "-byte message" + (unexpected ? " (unexpected)" : "");
      ++round;
      if (e.rank == 0) {
        std::memcpy(buf, payload.data(), bytes);
        Request s = e.comm.isend(buf, bytes, peer, 40);
        uint8_t one = 1;
        if (unexpected) HMC_EXPECT_OK(e.comm.send(&one, 1, peer, 41));  // behind the RTS
        HMC_EXPECT(flag.await(round), "rank 1 did not look at the " + what + " while rank 0 was away");
        HMC_EXPECT_OK(s.wait());
      } else {
        std::memset(buf, 0xA5, bytes);
        uint8_t one = 0;
        if (unexpected) HMC_EXPECT_OK(e.comm.recv(&one, 1, peer, 41));  // the RTS came first: it waits unmatched
        Request r = e.comm.irecv(buf, bytes, peer, 40);
        if (split) {
          // However late the sender's RTS comes (it may be descheduled on a loaded host),
          // the receiver's half lands while the sender waits for the flag.
          const std::size_t head = head_of(bytes);
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!test::landed(buf + head, payload.data() + head, bytes - head) &&
                 std::chrono::steady_clock::now() < until) {
            Status alone = r.wait(std::chrono::milliseconds(20));
            HMC_EXPECT(alone.code() == ErrorCode::kTimeout, "a split " + what + " ended without the sender: " + alone.to_string());
          }
          HMC_EXPECT(!r.test(), "a split " + what + " ended without the sender: " + r.status().to_string());
          HMC_EXPECT(std::memcmp(buf + head, payload.data() + head, bytes - head) == 0,
                     "the receiver's half of the " + what + " did not arrive while the sender was away");
          HMC_EXPECT(std::all_of(buf, buf + head, [](uint8_t b) { return b == 0xA5; }),
                     "the sender's half of the " + what + " arrived while the sender was away");
        } else {
          HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
        }
        flag.store(round);
        HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
        HMC_EXPECT(r.bytes() == bytes, what + ": " + std::to_string(r.bytes()) + " bytes reported");
        HMC_EXPECT(std::memcmp(buf, payload.data(), bytes) == 0, "wrong data in the " + what);
      }
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// Many split messages in flight both ways at once (HMC_RNDV=split: auto splits only where
// the other side's core is free, next test), under tags taken out of order, and the buffers
// reused: each arrives whole, in its own receive.
TEST_CASE("ucx: split rendezvous in flight both ways keep their bytes", "[ucx][rndv][split]") {
  if (ucx_missing()) return;
  auto settings = over_ucx("shm");
  settings["HMC_RNDV"] = "split";
  auto exits = test::run_ranks(2, settings, [](RankEnv& e) {
    const int peer = 1 - e.rank;
    constexpr int kMsgs = 6;
    const std::size_t bytes = (256u << 10) + 64 * 3 + 5;
    auto out = e.ctx.alloc({"cpu", 0}, bytes * kMsgs);
    auto in = e.ctx.alloc({"cpu", 0}, bytes * kMsgs);
    HMC_EXPECT_OK(out.status());
    HMC_EXPECT_OK(in.status());
    auto* src = static_cast<uint8_t*>(out->data());
    auto* dst = static_cast<uint8_t*>(in->data());
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<uint8_t>> mine, theirs;
      std::vector<Request> reqs;
      std::memset(dst, 0, bytes * kMsgs);
      for (int i = 0; i < kMsgs; ++i) {
        mine.push_back(test::random_bytes(bytes, 1000 * round + 10 * e.rank + i));
        theirs.push_back(test::random_bytes(bytes, 1000 * round + 10 * peer + i));
        std::memcpy(src + i * bytes, mine.back().data(), bytes);
      }
      for (int i = kMsgs - 1; i >= 0; --i) reqs.push_back(e.comm.irecv(dst + i * bytes, bytes, peer, 50 + i));
      for (int i = 0; i < kMsgs; ++i) reqs.push_back(e.comm.isend(src + i * bytes, bytes, peer, 50 + i));
      HMC_EXPECT_OK(wait_all(reqs.data(), reqs.size()));
      for (int i = 0; i < kMsgs; ++i)
        HMC_EXPECT(std::memcmp(dst + i * bytes, theirs[i].data(), bytes) == 0,
                   "message " + std::to_string(i) + " of round " + std::to_string(round) + " arrived wrong");
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// A receiver with a rendezvous send of its own under way does not split: its core copies
// already. Rank 1 has a 1 MiB send to rank 0 pending (rank 0 has not received it); rank 0
// then sends 256 KiB and stays out of HMC: rank 1 gets that message whole by itself, as in
// the get band without a split. Once rank 0 came back and took its message, a second 256 KiB
// is split again (its receive waits for rank 0).
TEST_CASE("ucx: a rank that sends a rendezvous of its own is not asked to split", "[ucx][rndv][split]") {
  if (ucx_missing()) return;
  SharedFlag flag;
  auto exits = test::run_ranks(2, over_ucx("shm"), [&flag](RankEnv& e) {
    const int peer = 1 - e.rank;
    const std::size_t bytes = 256u << 10, big = 1u << 20;
    HMC_EXPECT(e.comm.path(peer).split_from <= bytes && e.comm.path(peer).get_limit >= bytes, "not in the get band");
    auto small = e.ctx.alloc({"cpu", 0}, bytes);
    auto large = e.ctx.alloc({"cpu", 0}, big);
    HMC_EXPECT_OK(small.status());
    HMC_EXPECT_OK(large.status());
    auto* buf = static_cast<uint8_t*>(small->data());
    auto* other = static_cast<uint8_t*>(large->data());
    const auto payload = test::random_bytes(bytes, 123), second = test::random_bytes(bytes, 124);
    const auto pending = test::random_bytes(big, 125);
    if (e.rank == 0) {
      HMC_EXPECT(flag.await(1), "rank 1 did not start its send");
      std::memcpy(buf, payload.data(), bytes);
      Request s = e.comm.isend(buf, bytes, peer, 81);
      HMC_EXPECT(flag.await(2), "rank 1 did not receive while rank 0 was away");
      HMC_EXPECT_OK(s.wait());
      HMC_EXPECT_OK(e.comm.recv(other, big, peer, 80));
      HMC_EXPECT(std::memcmp(other, pending.data(), big) == 0, "rank 1's pending message arrived wrong");
      std::memcpy(buf, second.data(), bytes);
      s = e.comm.isend(buf, bytes, peer, 82);
      HMC_EXPECT(flag.await(3), "rank 1 did not look at the second message");
      HMC_EXPECT_OK(s.wait());
    } else {
      std::memcpy(other, pending.data(), big);
      Request mine = e.comm.isend(other, big, peer, 80);  // a rendezvous under way until rank 0 receives it
      flag.store(1);
      std::memset(buf, 0xA5, bytes);
      Request r = e.comm.irecv(buf, bytes, peer, 81);
      HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
      HMC_EXPECT(std::memcmp(buf, payload.data(), bytes) == 0, "the message received while busy arrived wrong");
      flag.store(2);
      HMC_EXPECT_OK(mine.wait());
      std::memset(buf, 0xA5, bytes);
      r = e.comm.irecv(buf, bytes, peer, 82);
      Status alone = r.wait(std::chrono::seconds(1));
      HMC_EXPECT(alone.code() == ErrorCode::kTimeout, "with nothing else under way a 256 KiB receive was not split: " + alone.to_string());
      flag.store(3);
      HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
      HMC_EXPECT(std::memcmp(buf, second.data(), bytes) == 0, "the second message arrived wrong");
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// HMC_RNDV=split splits every rendezvous the provider can get. Where UCX cannot read the
// sender's buffer directly (heap memory over shared memory; tcp; HMC_UCX_PUT=am) the
// receiver's get is refused after the head's put began, it asks for the rest, and the
// message still arrives whole; a send waits for both of its puts.
TEST_CASE("ucx: a split whose get is refused falls back to a put of the rest", "[ucx][rndv][split]") {
  if (ucx_missing()) return;
  struct Run { const char* tls; const char* put; bool heap; };
  for (const Run run : {Run{"shm", "auto", true}, Run{"shm", "am", false}, Run{"tcp", "auto", false}}) {
    DYNAMIC_SECTION(run.tls << ", HMC_UCX_PUT=" << run.put << (run.heap ? ", heap buffers" : ", Context::alloc")) {
      auto settings = over_ucx(run.tls);
      settings["HMC_RNDV"] = "split";
      settings["HMC_UCX_PUT"] = run.put;
      auto exits = test::run_ranks(2, settings, [run](RankEnv& e) {
        const int peer = 1 - e.rank;
        HMC_EXPECT(e.comm.path(peer).split_from == 0, "HMC_RNDV=split not taken");
        return round_trips(e, {std::size_t{200} << 10, (std::size_t{2} << 20) + 7}, run.heap);
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// A rank killed while a split message is under way, as sender or as receiver: the rank
// left fails its operation with peer lost within the deadline, or (where the copy beat the
// kill) completes with every byte, and the loss shows on its next receive.
TEST_CASE("ucx: a peer killed mid-split fails the survivor's operation", "[ucx][rndv][split][peer-lost]") {
  if (ucx_missing()) return;
  for (const int victim_sends : {1, 0}) {
    DYNAMIC_SECTION((victim_sends ? "the sender dies" : "the receiver dies")) {
      auto settings = over_ucx("shm");
      settings["HMC_TIMEOUT"] = "20s";
      auto exits = test::run_ranks(2, settings, [victim_sends](RankEnv& e) {
        const std::size_t bytes = 32u << 20;  // mapped from /dev/shm, on each rank
        auto mem = e.ctx.alloc({"cpu", 0}, bytes);
        HMC_EXPECT_OK(mem.status());
        auto* buf = static_cast<uint8_t*>(mem->data());
        std::memset(buf, e.rank == 1 ? 3 : 0, bytes);
        HMC_EXPECT(e.comm.path(1 - e.rank).split_from <= bytes, "not split");
        HMC_EXPECT_OK(e.comm.barrier());
        if (e.rank == 1) {  // the victim: killed from another thread while it copies its half, mostly
          Request r = victim_sends ? e.comm.isend(buf, bytes, 0, 70) : e.comm.irecv(buf, bytes, 0, 70);
          std::thread killer([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            kill(getpid(), SIGKILL);
          });
          for (;;) r.test();
        }
        auto t0 = std::chrono::steady_clock::now();
        Status s = victim_sends ? e.comm.recv(buf, bytes, 1, 70) : e.comm.send(buf, bytes, 1, 70);
        if (s.ok()) {
          if (victim_sends)
            HMC_EXPECT(std::all_of(buf, buf + bytes, [](uint8_t b) { return b == 3; }),
                       "a receive from a sender killed mid-split completed without all its data");
          t0 = std::chrono::steady_clock::now();
          uint8_t one = 0;
          s = e.comm.recv(&one, 1, 1, 71);
        }
        HMC_EXPECT(s.code() == ErrorCode::kPeerLost, s.to_string());
        HMC_EXPECT(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10), "peer loss took too long to notice");
        e.comm.abort();
        return 0;
      }, std::chrono::seconds(60));
      INFO(test::describe(exits));
      REQUIRE(exits[0].exit_code == 0);
      REQUIRE(exits[1].signal == SIGKILL);
    }
  }
}
