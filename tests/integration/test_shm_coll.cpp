// Small collectives over shared segments (collectives/shm_coll.h), in real processes:
// exact results with several in flight (slots reused only once every rank read them), and
// the message path still right with them turned off. A lost peer failing a pending one is
// in test_collectives.cpp ("a lost peer fails the collective on the survivors").
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "core/comm_impl.h"
#include "hmc/collectives.h"
#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

const auto kWait = std::chrono::seconds(30);

std::map<std::string, std::string> shm(bool on) {
  return {{"HMC_TIMEOUT", "30s"}, {"HMC_SHM_COLL", on ? "1" : "0"}};
}

// Value element i of rank r contributes to call k.
int32_t in(int k, int r, std::size_t i) { return static_cast<int32_t>(k * 1000 + r * 10 + static_cast<int>(i)); }

int check_rounds(RankEnv& e, bool expect_segments) {
  const int n = e.size, me = e.rank;
  HMC_EXPECT((e.comm.impl().segments() != nullptr) == expect_segments,
             std::string("segments ") + (expect_segments ? "missing" : "present"));
  constexpr std::size_t kCount = 3;
  // Five calls in flight before any wait: the third must wait for every rank to finish
  // reading the first one's slot.
  constexpr int kCalls = 5;
  std::vector<std::vector<int32_t>> send(kCalls), recv(kCalls);
  std::vector<Request> reqs;
  for (int k = 0; k < kCalls; ++k) {
    const int kind = k % 3;  // all_reduce, all_gather, all_to_all
    const std::size_t in_elems = kind == 2 ? kCount * n : kCount;
    const std::size_t out_elems = kind == 0 ? kCount : kCount * n;
    for (std::size_t i = 0; i < in_elems; ++i) send[k].push_back(in(k, me, i));
    recv[k].assign(out_elems, -1);
    if (kind == 0)
      reqs.push_back(all_reduce(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32, ReduceOp::kSum));
    else if (kind == 1)
      reqs.push_back(all_gather(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32));
    else
      reqs.push_back(all_to_all(e.comm, send[k].data(), recv[k].data(), kCount, DataType::kInt32));
  }
  for (int k = kCalls - 1; k >= 0; --k) HMC_EXPECT_OK(reqs[k].wait(kWait));
  for (int k = 0; k < kCalls; ++k) {
    const int kind = k % 3;
    for (std::size_t j = 0; j < recv[k].size(); ++j) {
      int32_t want = 0;
      if (kind == 0)
        for (int r = 0; r < n; ++r) want += in(k, r, j);
      else if (kind == 1)
        want = in(k, static_cast<int>(j / kCount), j % kCount);
      else
        want = in(k, static_cast<int>(j / kCount), me * kCount + j % kCount);
      HMC_EXPECT(recv[k][j] == want, "call " + std::to_string(k) + " element " + std::to_string(j) + ": " +
                                          std::to_string(recv[k][j]) + ", want " + std::to_string(want));
    }
  }
  // Many rounds one after another, in place, each checked: slots alternate and refill.
  for (int k = 0; k < 300; ++k) {
    double v[2] = {me + 0.25 * k, -1.0 * me};
    HMC_EXPECT_OK(all_reduce(e.comm, v, v, 2, DataType::kFloat64, ReduceOp::kMax).wait(kWait));
    HMC_EXPECT(v[0] == (n - 1) + 0.25 * k && v[1] == 0.0, "round " + std::to_string(k));
  }
  return 0;
}

void run(int ranks, bool on) {
  auto exits = test::run_ranks(ranks, shm(on), [on](RankEnv& e) { return check_rounds(e, on); });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

}  // namespace

TEST_CASE("small collectives over shared segments are exact with several in flight", "[collectives][shm]") {
  for (int n = 2; n <= 4; ++n) {
    DYNAMIC_SECTION(n << " ranks") { run(n, true); }
  }
}

TEST_CASE("small collectives stay exact on messages with HMC_SHM_COLL=0", "[collectives][shm]") {
  run(3, false);
}
