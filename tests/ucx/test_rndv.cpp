// The receiver-driven rendezvous over ucx (core/rndv_get.cpp): where UCX maps the peer's
// shared memory, the receiver gets a large message from the sender's buffer; where the
// provider refuses the get, the receiver asks for a put instead and the data still arrives.
#include <unistd.h>

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

// A put rendezvous needs the sender inside HMC to answer the CTS; a get does not: rank 1's
// receive completes while rank 0, having posted its send, stays out of HMC until rank 1
// says so through memory the two processes share. Up to the pair's get limit the receive
// completes so; one byte more goes by put, and the same receive times out until rank 0
// comes back (as every size would with HMC_RNDV=put or the get disabled); from the second
// band's start (get_from) up, gets again. The split rendezvous, which needs the sender from
// 128 KiB up by default, is off here (test_split.cpp); turns are not taken, each message
// being alone (test_turns.cpp).
TEST_CASE("ucx: over shared memory the receiver gets a rendezvous without the sender's help", "[ucx][rndv]") {
  if (ucx_missing()) return;
  SharedFlag flag;
  auto settings = over_ucx("shm");
  settings["HMC_RNDV_SPLIT"] = "0";
  auto exits = test::run_ranks(2, settings, [&flag](RankEnv& e) {
    HMC_EXPECT(e.comm.path(1 - e.rank).split_from == SIZE_MAX, "HMC_RNDV_SPLIT=0 not taken");
    const int peer = 1 - e.rank;
    const std::size_t limit = e.comm.path(peer).get_limit, from = e.comm.path(peer).get_from;
    HMC_EXPECT(limit >= (64u << 10) && limit < SIZE_MAX, "get limit " + std::to_string(limit));
    HMC_EXPECT(from > limit + 1 && from < SIZE_MAX, "gets from " + std::to_string(from));
    const std::size_t sizes[] = {64 << 10, limit / 2 + 3, limit, limit + 1, from - 1, from, from + 4099};
    int round = 0;
    for (std::size_t bytes : sizes) {
      ++round;
      const bool by_get = bytes <= limit || bytes >= from;
      auto mem = e.ctx.alloc({"cpu", 0}, bytes);  // with ucx the only net provider: its mem_alloc
      HMC_EXPECT_OK(mem.status());
      auto* buf = static_cast<uint8_t*>(mem->data());
      const auto payload = test::random_bytes(bytes, 70 + round);
      if (e.rank == 0) {
        std::memcpy(buf, payload.data(), bytes);
        Request s = e.comm.isend(buf, bytes, peer, 30);
        HMC_EXPECT(flag.await(round), "rank 1 did not receive " + std::to_string(bytes) + " bytes while rank 0 was away");
        HMC_EXPECT_OK(s.wait());
      } else {
        std::memset(buf, 0xA5, bytes);
        Request r = e.comm.irecv(buf, bytes, peer, 30);
        if (by_get) {
          HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
        } else {
          Status alone = r.wait(std::chrono::seconds(1));
          HMC_EXPECT(alone.code() == ErrorCode::kTimeout, "a put rendezvous of " + std::to_string(bytes) +
                                                              " bytes ended without the sender: " + alone.to_string());
        }
        flag.store(round);
        if (!by_get) HMC_EXPECT_OK(r.wait(std::chrono::seconds(10)));
        HMC_EXPECT(std::memcmp(buf, payload.data(), bytes) == 0, "wrong data in a " + std::to_string(bytes) + "-byte receive");
      }
    }
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

// HMC_RNDV=get offers every rendezvous for a get. Heap memory over shared memory, and any
// memory with HMC_UCX_PUT=am, is not readable directly: the provider refuses the first get
// after the key's check and later ones at once, and each time the receiver asks for a put.
TEST_CASE("ucx: a get the provider refuses falls back to a put", "[ucx][rndv]") {
  if (ucx_missing()) return;
  for (const bool heap : {true, false}) {
    DYNAMIC_SECTION((heap ? "heap buffers" : "buffers from Context::alloc, HMC_UCX_PUT=am")) {
      auto settings = over_ucx("shm");
      settings["HMC_RNDV"] = "get";
      if (!heap) settings["HMC_UCX_PUT"] = "am";
      auto exits = test::run_ranks(2, settings, [heap](RankEnv& e) {
        HMC_EXPECT(e.comm.path(1 - e.rank).get_limit == SIZE_MAX, "HMC_RNDV=get not taken");
        return round_trips(e, {std::size_t{64} << 10, (std::size_t{1} << 20) + 3}, heap);
      });
      INFO(test::describe(exits));
      REQUIRE(test::all_ok(exits));
    }
  }
}

TEST_CASE("ucx: a malformed HMC_RNDV fails the context with the reason", "[ucx][rndv]") {
  if (ucx_missing()) return;
  auto ctx = Context::create({{{"HMC_PROVIDERS", "cpu,ucx"}, {"HMC_RNDV", "sideways"}}});
  REQUIRE_FALSE(ctx.ok());
  CHECK(ctx.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(ctx.status().message(),
             Catch::Contains("HMC_RNDV='sideways'") && Catch::Contains("'auto', 'put', 'get' or 'split'"));
}
