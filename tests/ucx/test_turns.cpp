// Taking turns over ucx (core/rndv_get.cpp, HMC_RNDV_TURNS): between ranks of one host a
// receiver that got the last get-band message from a peer asks the sender to put the next
// one, from 64 KiB up and if it goes into another buffer, so both ranks copy a stream.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>

#include "harness.h"
#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;
using ucx_test::over_ucx;
using ucx_test::SharedFlag;
using ucx_test::ucx_missing;

namespace {

constexpr std::size_t kBytes = 64u << 10;  // above ucx's eager limit on one host, below the split

// Rank 1 posts its receives into `slots[i]` of its buffer; then rank 0 sends three messages
// from buffers of their own and stays out of HMC. Those marked `alone` rank 1 gets by
// itself, the others wait for rank 0's put: after a second they have not ended and their
// bytes are still the fill. Then rank 0 comes back and every message arrives whole. The
// receives are posted before the messages come, so each message finds the later ones'
// receives posted (a stream) whatever the timing. `busy`: rank 1 first starts a 1 MiB send
// to rank 0 that stays under way. `reuse`: rank 1 posts the second and third receives only
// once the first ended. `serial`: rank 0 waits for the first message before it sends the
// others, so the second's RTS does not say that another is under way (kRtsMore).
int three_messages(RankEnv& e, const SharedFlag& flag, const std::size_t slots[3], const bool alone[3], bool busy,
                   bool reuse, bool serial = false) {
  const int peer = 1 - e.rank;
  auto mem = e.ctx.alloc({"cpu", 0}, 3 * kBytes);
  auto big = e.ctx.alloc({"cpu", 0}, 1u << 20);
  HMC_EXPECT_OK(mem.status());
  HMC_EXPECT_OK(big.status());
  auto* buf = static_cast<uint8_t*>(mem->data());
  std::vector<std::vector<uint8_t>> payload;
  for (int i = 0; i < 3; ++i) payload.push_back(test::random_bytes(kBytes, 300 + i));
  const auto pending = test::random_bytes(big->size(), 310);
  if (e.rank == 0) {
    HMC_EXPECT(flag.await(1), "rank 1 did not post its receives");
    std::vector<Request> sends;
    for (int i = 0; i < 3; ++i) {
      std::memcpy(buf + i * kBytes, payload[i].data(), kBytes);
      sends.push_back(e.comm.isend(buf + i * kBytes, kBytes, peer, 60 + i));
      if (serial && i == 0) HMC_EXPECT_OK(sends[0].wait());
    }
    HMC_EXPECT(flag.await(2), "rank 1 did not look at the messages while rank 0 was away");
    HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
    if (busy) {
      HMC_EXPECT_OK(e.comm.recv(big->data(), big->size(), peer, 69));
      HMC_EXPECT(std::memcmp(big->data(), pending.data(), big->size()) == 0, "rank 1's pending message arrived wrong");
    }
    return 0;
  }
  Request mine;
  if (busy) {
    std::memcpy(big->data(), pending.data(), big->size());
    mine = e.comm.isend(big->data(), big->size(), peer, 69);  // under way until rank 0 receives it
  }
  std::memset(buf, 0xA5, 3 * kBytes);
  auto arrived = [&](int i) { return std::memcmp(buf + slots[i], payload[i].data(), kBytes) == 0; };
  Request r[3];
  auto post = [&](int i) { r[i] = e.comm.irecv(buf + slots[i], kBytes, peer, 60 + i); };
  post(0);
  if (!reuse) {
    post(1);
    post(2);
  }
  flag.store(1);
  if (reuse) {
    HMC_EXPECT(alone[0], "a reused buffer needs the first message to end alone");
    HMC_EXPECT_OK(r[0].wait(std::chrono::seconds(10)));
    HMC_EXPECT(arrived(0), "message 0 arrived wrong");
    post(1);
    post(2);
  }
  for (int i = 0; i < 3; ++i) {
    const std::string what = "message " + std::to_string(i);
    if (alone[i]) {
      HMC_EXPECT_OK(r[i].wait(std::chrono::seconds(10)));
      HMC_EXPECT(reuse && i == 0 || arrived(i), what + " arrived wrong");
      continue;
    }
    Status s = r[i].wait(std::chrono::seconds(1));
    HMC_EXPECT(s.code() == ErrorCode::kTimeout, what + " ended without its sender: " + s.to_string());
    HMC_EXPECT(std::all_of(buf + slots[i], buf + slots[i] + kBytes, [](uint8_t b) { return b == 0xA5; }),
               "bytes of " + what + " arrived while its sender was away");
  }
  flag.store(2);
  for (int i = 0; i < 3; ++i) {
    HMC_EXPECT_OK(r[i].wait(std::chrono::seconds(10)));
    HMC_EXPECT(r[i].bytes() == kBytes, std::to_string(r[i].bytes()) + " bytes reported");
    HMC_EXPECT(reuse && i == 0 || arrived(i), "message " + std::to_string(i) + " arrived wrong");
  }
  if (busy) HMC_EXPECT_OK(mine.wait());
  return 0;
}

}  // namespace

TEST_CASE("ucx: the receiver and the sender take turns at copying a stream", "[ucx][rndv][turns]") {
  if (ucx_missing()) return;
  struct Run {
    const char* name;
    const char* turns;  // HMC_RNDV_TURNS; "" leaves the default (64K)
    std::size_t from;   // PathInfo::turns_from then
    std::size_t slots[3];
    bool alone[3];
    bool busy, reuse;
    bool serial = false;
  };
  const std::size_t three[3] = {0, kBytes, 2 * kBytes};
  const Run runs[] = {
      {"three buffers: got, put, got", "", kBytes, {three[0], three[1], three[2]}, {true, false, true}, false, false},
      {"HMC_RNDV_TURNS=0: every one got", "0", SIZE_MAX, {three[0], three[1], three[2]}, {true, true, true}, false, false},
      {"HMC_RNDV_TURNS above the size: every one got", "96K", 96u << 10, {three[0], three[1], three[2]}, {true, true, true},
       false, false},
      // The second message goes into the first's buffer (the third is on its way): got. The
      // third has no receive posted after it, but its sender has the other two under way
      // (kRtsMore): a stream, so the sender puts it.
      {"a buffer reused: got, got, put", "", kBytes, {0, 0, kBytes}, {true, true, false}, false, true},
      {"a buffer overlapping the last: got, got, put", "", kBytes, {0, kBytes / 2, 2 * kBytes}, {true, true, false}, false,
       true},
      {"a receiver with a rendezvous send under way: every one got", "", kBytes, {three[0], three[1], three[2]},
       {true, true, true}, true, false},
      // The second's sender has nothing else under way, but the third's receive is posted:
      // a stream all the same.
      {"one at a time, the receives posted ahead: got, put, got", "", kBytes, {three[0], three[1], three[2]},
       {true, false, true}, false, false, true},
  };
  for (const Run& run : runs) {
    DYNAMIC_SECTION(run.name) {
      SharedFlag flag;
      auto settings = over_ucx("shm");
      if (*run.turns) settings["HMC_RNDV_TURNS"] = run.turns;
      auto exits = test::run_ranks(2, settings, [&](RankEnv& e) {
        const PathInfo path = e.comm.path(1 - e.rank);
        HMC_EXPECT(path.turns_from == run.from, "turns from " + std::to_string(path.turns_from));
        HMC_EXPECT(path.eager_limit < kBytes && path.get_limit >= kBytes && path.split_from > kBytes, "64 KiB not in the get band");
        return three_messages(e, flag, run.slots, run.alone, run.busy, run.reuse, run.serial);
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

// A sender with a rendezvous receive of its own under way does not offer its turn (its
// RTS lacks kRtsTurn): it copies already. Rank 2 starts a 1 MiB send to rank 0 and stays
// away; rank 0 gets its half of that split message, so its receive is under way until
// rank 2 comes back. Rank 0 then sends three messages to rank 1 and stays away too: rank 1
// gets all three by itself.
TEST_CASE("ucx: a sender with a rendezvous receive under way is not asked to put", "[ucx][rndv][turns]") {
  if (ucx_missing()) return;
  SharedFlag flag;
  auto exits = test::run_ranks(3, over_ucx("shm"), [&flag](RankEnv& e) {
    auto mem = e.ctx.alloc({"cpu", 0}, 3 * kBytes);
    auto big = e.ctx.alloc({"cpu", 0}, 1u << 20);
    HMC_EXPECT_OK(mem.status());
    HMC_EXPECT_OK(big.status());
    auto* buf = static_cast<uint8_t*>(mem->data());
    const auto pending = test::random_bytes(big->size(), 410);
    std::vector<std::vector<uint8_t>> payload;
    for (int i = 0; i < 3; ++i) payload.push_back(test::random_bytes(kBytes, 400 + i));
    if (e.rank == 2) {
      std::memcpy(big->data(), pending.data(), big->size());
      Request s = e.comm.isend(big->data(), big->size(), 0, 69);
      HMC_EXPECT(flag.await(2), "rank 1 did not receive while ranks 0 and 2 were away");
      HMC_EXPECT_OK(s.wait());
    } else if (e.rank == 0) {
      HMC_EXPECT(e.comm.path(1).turns_from == kBytes, "no turns to rank 1");
      // Waits until the receive is under way, however late rank 2's RTS comes: its half of
      // the split (the second) arrived while rank 2 is away.
      auto* b = static_cast<uint8_t*>(big->data());
      const std::size_t head = big->size() / 2;
      std::memset(b, 0, big->size());
      Request big_recv = e.comm.irecv(b, big->size(), 2, 69);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!test::landed(b + head, pending.data() + head, head) && std::chrono::steady_clock::now() < until) {
        Status early = big_recv.wait(std::chrono::milliseconds(20));
        HMC_EXPECT(early.code() == ErrorCode::kTimeout, "the 1 MiB receive ended with its sender away: " + early.to_string());
      }
      HMC_EXPECT(test::landed(b + head, pending.data() + head, head), "rank 0 did not get its half of rank 2's message");
      std::vector<Request> sends;
      for (int i = 0; i < 3; ++i) {
        std::memcpy(buf + i * kBytes, payload[i].data(), kBytes);
        sends.push_back(e.comm.isend(buf + i * kBytes, kBytes, 1, 60 + i));
      }
      flag.store(1);
      HMC_EXPECT(flag.await(2), "rank 1 did not receive while rank 0 was away");
      HMC_EXPECT_OK(wait_all(sends.data(), sends.size()));
      HMC_EXPECT_OK(big_recv.wait());
      HMC_EXPECT(std::memcmp(big->data(), pending.data(), big->size()) == 0, "rank 2's message arrived wrong");
    } else {
      HMC_EXPECT(flag.await(1), "rank 0 did not send");
      std::memset(buf, 0xA5, 3 * kBytes);
      for (int i = 0; i < 3; ++i) {
        HMC_EXPECT_OK(e.comm.recv(buf + i * kBytes, kBytes, 0, 60 + i));
        HMC_EXPECT(std::memcmp(buf + i * kBytes, payload[i].data(), kBytes) == 0, "message " + std::to_string(i) + " arrived wrong");
      }
      flag.store(2);
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// A stream both ways in turn, eight messages in flight into buffers of their own, each
// round's buffers reused: every message arrives whole whichever rank copied it.
TEST_CASE("ucx: a stream copied in turns keeps its bytes", "[ucx][rndv][turns]") {
  if (ucx_missing()) return;
  auto exits = test::run_ranks(2, over_ucx("shm"), [](RankEnv& e) {
    const int peer = 1 - e.rank;
    constexpr int kMsgs = 8;
    const std::size_t bytes = kBytes + 64 + 3;
    auto mem = e.ctx.alloc({"cpu", 0}, bytes * kMsgs);
    HMC_EXPECT_OK(mem.status());
    auto* buf = static_cast<uint8_t*>(mem->data());
    for (int round = 0; round < 6; ++round) {
      const bool sending = (round % 2) == e.rank;
      std::vector<std::vector<uint8_t>> payload;
      for (int i = 0; i < kMsgs; ++i) payload.push_back(test::random_bytes(bytes, 1000 * round + i));
      std::vector<Request> reqs;
      if (!sending) std::memset(buf, 0, bytes * kMsgs);
      for (int i = 0; i < kMsgs; ++i) {
        uint8_t* at = buf + i * bytes;
        if (sending) std::memcpy(at, payload[i].data(), bytes);
        reqs.push_back(sending ? e.comm.isend(at, bytes, peer, 70) : e.comm.irecv(at, bytes, peer, 70));
      }
      HMC_EXPECT_OK(wait_all(reqs.data(), reqs.size()));
      for (int i = 0; !sending && i < kMsgs; ++i)
        HMC_EXPECT(std::memcmp(buf + i * bytes, payload[i].data(), bytes) == 0,
                   "message " + std::to_string(i) + " of round " + std::to_string(round) + " arrived wrong");
      HMC_EXPECT_OK(e.comm.barrier());
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// Only between ranks of one host where ucx gets: not over tcp, nor where the rendezvous is
// forced one way.
TEST_CASE("ucx: turns are taken only where the receiver could get", "[ucx][rndv][turns]") {
  if (ucx_missing()) return;
  struct Run { const char* tls; const char* rndv; std::size_t from; };
  for (const Run run : {Run{"shm", "auto", kBytes}, Run{"tcp", "auto", SIZE_MAX}, Run{"shm", "get", SIZE_MAX},
                        Run{"shm", "put", SIZE_MAX}}) {
    DYNAMIC_SECTION("UCX_TLS=" << run.tls << ", HMC_RNDV=" << run.rndv) {
      auto settings = over_ucx(run.tls);
      settings["HMC_RNDV"] = run.rndv;
      auto exits = test::run_ranks(2, settings, [run](RankEnv& e) {
        const std::size_t from = e.comm.path(1 - e.rank).turns_from;
        HMC_EXPECT(from == run.from, "turns from " + std::to_string(from));
        return 0;
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}
