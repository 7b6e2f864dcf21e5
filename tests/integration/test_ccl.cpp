// Delegation to a collective provider (collectives/ccl.cpp), with the test-only "fake"
// provider (tests/ccl-fake) that works on host memory. The collective suite runs through it
// as `collectives.ccl-fake`; these cases check the choice itself: a call goes to the
// provider only when it should, and a provider failure is an error on every rank.
#include <catch2/catch.hpp>

#include <thread>

#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

// The fake provider fails every operation on rank 1: a delegated call cannot succeed.
std::map<std::string, std::string> failing_on_rank1(const std::string& ccl = "auto") {
  return {{"HMC_PROVIDER_PATH", HMC_FAKECCL_DIR}, {"HMC_FAKE_FAIL_RANK", "1"}, {"HMC_CCL", ccl},
          {"HMC_TIMEOUT", "5s"}};
}

// Runs body on `ranks` ranks and requires every one to end well (within 60 s).
void run(int ranks, const std::map<std::string, std::string>& s, const std::function<int(RankEnv&)>& body) {
  auto exits = test::run_ranks(ranks, s, body, std::chrono::seconds(60));
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

int sum_of_ranks(RankEnv& e, const CollOptions& opt) {
  int64_t v = e.rank + 1, out = 0;
  HMC_EXPECT_OK(all_reduce(e.comm, &v, &out, 1, DataType::kInt64, ReduceOp::kSum, opt).wait());
  HMC_EXPECT(out == e.size * (e.size + 1) / 2, "sum " + std::to_string(out));
  return 0;
}

}  // namespace

TEST_CASE("a communicator whose ranks all can delegates, and a provider failure fails every rank", "[ccl]") {
  run(3, failing_on_rank1(), [](RankEnv& e) {
    std::vector<float> a(1000, 1.f);
    Status first = all_reduce(e.comm, a.data(), a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    HMC_EXPECT(!first.ok(), "rank " + std::to_string(e.rank) + ": the delegated all_reduce succeeded");
    if (e.rank == 1) HMC_EXPECT(first.message().find("HMC_FAKE_FAIL_RANK") != std::string::npos, first.to_string());
    // Every later delegated call fails at once, the same way, rather than switching paths.
    Status again = all_gather(e.comm, a.data(), a.data(), 1, DataType::kFloat32).wait(std::chrono::seconds(1));
    HMC_EXPECT(!again.ok() && again.code() != ErrorCode::kTimeout, again.to_string());
    e.comm.abort();
    return 0;
  });
}

// Rank 0's first delegable calls return at once and wait for the delegation to be decided,
// which needs rank 1's first one; rank 1 never makes it. abort() fails them at once.
TEST_CASE("abort() fails collectives that wait for delegation to be decided", "[ccl]") {
  auto s = failing_on_rank1();
  s.erase("HMC_FAKE_FAIL_RANK");
  s["HMC_TIMEOUT"] = "30s";
  run(2, s, [](RankEnv& e) {
    if (e.rank == 1) {  // rank 0's abort ends this receive
      uint8_t none = 0;
      Status st = e.comm.recv(&none, 1, 0, 5);
      HMC_EXPECT(st.code() == ErrorCode::kPeerLost, st.to_string());
      e.comm.abort();
      return 0;
    }
    std::vector<float> a(1000, 1.f), b(1000, 0.f);
    const auto t0 = std::chrono::steady_clock::now();
    Request first = all_reduce(e.comm, a.data(), b.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
    Request second = all_gather(e.comm, a.data(), b.data(), 500, DataType::kFloat32);
    // Not until HMC_TIMEOUT (30 s), as when the first call waited for the exchange.
    const auto took = std::chrono::steady_clock::now() - t0;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    HMC_EXPECT(took < std::chrono::seconds(10), "the calls took " + std::to_string(ms) + " ms to return");
    Status early = first.wait(std::chrono::milliseconds(300));
    HMC_EXPECT(early.code() == ErrorCode::kTimeout, "an all_reduce without its peer: " + early.to_string());
    e.comm.abort();
    for (Request* r : {&first, &second}) {
      Status st = r->wait(std::chrono::seconds(5));
      HMC_EXPECT(st.code() == ErrorCode::kAborted, "after abort(): " + st.to_string());
    }
    return 0;
  });
}

// Delegation asked again: rank 1 passes emulated device memory (not the fake provider's
// cpu memory) to its first two all_reduces, so the exchanges they start say "not yet", and
// host memory to the next two, so the third exchange turns delegation on. Each call must
// run where it runs on the other rank, also when several wait for one exchange: rank 0
// starts all four before rank 1 starts any. With the fake failing every operation on rank
// 1, the first two succeed on HMC's schedule and the last two fail in the provider.
TEST_CASE("calls that wait for an exchange asked again run where the other ranks run them", "[ccl]") {
  auto s = failing_on_rank1();
  s["HMC_PROVIDER_PATH"] = std::string(HMC_FAKECCL_DIR) + ":" + HMC_TEST_PROVIDERS_DIR;
  s["HMC_TIMEOUT"] = "20s";
  run(2, s, [](RankEnv& e) {
    constexpr std::size_t kCount = 256, kBytes = kCount * sizeof(int32_t);
    std::vector<std::vector<int32_t>> in(4, std::vector<int32_t>(kCount)), out(4, std::vector<int32_t>(kCount, -1));
    std::vector<Memory> dev;
    std::vector<void*> send(4), recv(4);
    for (int i = 0; i < 4; ++i) {
      for (std::size_t k = 0; k < kCount; ++k) in[i][k] = static_cast<int32_t>(1000 * i + 10 * k + e.rank);
      send[i] = in[i].data();
      recv[i] = out[i].data();
      if (e.rank == 1 && i < 2) {  // emulated device memory: not the fake's
        for (int side = 0; side < 2; ++side) {
          auto m = e.ctx.alloc(DeviceId{"emu", 0}, kBytes);
          HMC_EXPECT(m.ok(), m.status().to_string());
          dev.push_back(std::move(m.value()));
        }
        send[i] = dev[dev.size() - 2].data();
        recv[i] = dev.back().data();
        HMC_EXPECT_OK(e.ctx.copy(send[i], in[i].data(), kBytes));
      }
    }
    if (e.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<Request> r;
    for (int i = 0; i < 4; ++i)
      r.push_back(all_reduce(e.comm, send[i], recv[i], kCount, DataType::kInt32, ReduceOp::kSum));
    for (int i = 0; i < 2; ++i) {
      HMC_EXPECT(r[i].wait().ok(), "all_reduce " + std::to_string(i) + ": " + r[i].status().to_string());
      if (recv[i] != out[i].data()) HMC_EXPECT_OK(e.ctx.copy(out[i].data(), recv[i], kBytes));
      for (std::size_t k = 0; k < kCount; ++k)
        HMC_EXPECT(out[i][k] == static_cast<int32_t>(2 * (1000 * i + 10 * k) + 1), "all_reduce " + std::to_string(i));
    }
    for (int i = 2; i < 4; ++i) {
      Status st = r[i].wait();
      HMC_EXPECT(!st.ok() && st.code() != ErrorCode::kTimeout, "all_reduce " + std::to_string(i) + ": " + st.to_string());
    }
    e.comm.abort();
    return 0;
  });
}

// Collectives that are not delegated wait behind those that wait for the decision: the
// shared segments number collectives as they start, so a barrier that overtook rank 0's
// waiting calls would meet rank 1's all_reduce. Rank 0 starts all four calls before rank
// 1 starts any; rank 1 waits for its first before it starts the rest, when delegation is
// decided (off: the fake gives no communicator id) and nothing waits any more. The last,
// all_to_all_v, gets vectors its caller changes before the call runs.
TEST_CASE("collectives made while delegation is decided keep their order", "[ccl]") {
  std::map<std::string, std::string> s{{"HMC_PROVIDER_PATH", HMC_FAKECCL_DIR}, {"HMC_CCL", "auto"},
                                       {"HMC_FAKE_NO_ID", "1"}, {"HMC_TIMEOUT", "20s"}};
  run(2, s, [](RankEnv& e) {
    constexpr std::size_t kCount = 64;
    std::vector<int64_t> a(kCount), b(kCount), sum_a(kCount, -1), sum_b(kCount, -1), all(2 * kCount, -1);
    for (std::size_t k = 0; k < kCount; ++k) {
      a[k] = static_cast<int64_t>(k + 100 * e.rank);
      b[k] = static_cast<int64_t>(3 * k + 1000 * e.rank);
    }
    auto first = [&] { return all_reduce(e.comm, a.data(), sum_a.data(), kCount, DataType::kInt64, ReduceOp::kSum); };
    std::vector<Request> r;
    if (e.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      HMC_EXPECT_OK(first().wait());
    } else {
      r.push_back(first());
    }
    r.push_back(all_gather(e.comm, a.data(), all.data(), kCount, DataType::kInt64));
    r.push_back(barrier(e.comm));
    r.push_back(all_reduce(e.comm, b.data(), sum_b.data(), kCount, DataType::kInt64, ReduceOp::kSum));
    // all_to_all_v's vectors are the caller's to change once it returned, waiting or not.
    std::vector<std::size_t> counts{kCount, kCount}, displs{0, kCount};
    std::vector<int64_t> blocks(2 * kCount), swapped(2 * kCount, -1);
    for (std::size_t k = 0; k < 2 * kCount; ++k) blocks[k] = static_cast<int64_t>(1000 * e.rank + k);
    r.push_back(all_to_all_v(e.comm, blocks.data(), counts, displs, swapped.data(), counts, displs, DataType::kInt64));
    displs = {kCount, 0};
    counts = {0, 0};
    HMC_EXPECT_OK(wait_all(r.data(), r.size()));
    for (std::size_t k = 0; k < 2 * kCount; ++k) {  // from rank k / kCount: its block for this rank
      const std::size_t from = k / kCount, at = e.rank * kCount + k % kCount;
      HMC_EXPECT(swapped[k] == static_cast<int64_t>(1000 * from + at), "all_to_all_v at " + std::to_string(k));
    }
    for (std::size_t k = 0; k < kCount; ++k) {
      HMC_EXPECT(sum_a[k] == static_cast<int64_t>(2 * k + 100), "first all_reduce at " + std::to_string(k));
      HMC_EXPECT(sum_b[k] == static_cast<int64_t>(6 * k + 1000), "second all_reduce at " + std::to_string(k));
      HMC_EXPECT(all[k] == static_cast<int64_t>(k) && all[kCount + k] == static_cast<int64_t>(k + 100), "all_gather");
    }
    return 0;
  });
}

TEST_CASE("HMC_CCL=off, a named algorithm and the argument check keep HMC's own schedules", "[ccl]") {
  auto off = test::run_ranks(3, failing_on_rank1("off"), [](RankEnv& e) { return sum_of_ranks(e, {}); });
  INFO(test::describe(off));
  REQUIRE(test::all_ok(off));
  auto named = test::run_ranks(3, failing_on_rank1(), [](RankEnv& e) {
    CollOptions ring;
    ring.algorithm = "ring";
    CollOptions checked;
    checked.check = true;
    if (int rc = sum_of_ranks(e, ring)) return rc;
    return sum_of_ranks(e, checked);
  });
  INFO(test::describe(named));
  REQUIRE(test::all_ok(named));
}

TEST_CASE("gather, scatter and barrier never go to the provider", "[ccl]") {
  run(3, failing_on_rank1(), [](RankEnv& e) {
    int32_t mine = e.rank, all[3] = {-1, -1, -1};
    HMC_EXPECT_OK(gather(e.comm, &mine, all, 1, DataType::kInt32, 0).wait());
    if (e.rank == 0) HMC_EXPECT(all[0] == 0 && all[1] == 1 && all[2] == 2, "gathered values");
    HMC_EXPECT_OK(e.comm.barrier());
    return 0;
  });
}

TEST_CASE("a malformed HMC_CCL is refused clearly", "[ccl][errors]") {
  auto ctx = Context::create({failing_on_rank1("sometimes")});
  REQUIRE_FALSE(ctx.ok());
  CHECK(ctx.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(ctx.status().message(), Catch::Contains("HMC_CCL='sometimes'") && Catch::Contains("'auto' or 'off'"));
}
