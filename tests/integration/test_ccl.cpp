// Delegation to a collective provider (collectives/ccl.cpp), with the test-only "fake"
// provider (tests/ccl-fake) that works on host memory. The collective suite runs through it
// as `collectives.ccl-fake`; these cases check the choice itself: a call goes to the
// provider only when it should, and a provider failure is an error on every rank.
#include <catch2/catch.hpp>

#include "multiprocess.h"

using namespace hmc;
using hmc::test::RankEnv;

namespace {

// The fake provider fails every operation on rank 1: a delegated call cannot succeed.
std::map<std::string, std::string> failing_on_rank1(const std::string& ccl = "auto") {
  return {{"HMC_PROVIDER_PATH", HMC_FAKECCL_DIR}, {"HMC_FAKECCL_FAIL_RANK", "1"}, {"HMC_CCL", ccl},
          {"HMC_TIMEOUT", "5s"}};
}

int sum_of_ranks(RankEnv& e, const CollOptions& opt) {
  int64_t v = e.rank + 1, out = 0;
  HMC_EXPECT_OK(all_reduce(e.comm, &v, &out, 1, DataType::kInt64, ReduceOp::kSum, opt).wait());
  HMC_EXPECT(out == e.size * (e.size + 1) / 2, "sum " + std::to_string(out));
  return 0;
}

}  // namespace

TEST_CASE("a communicator whose ranks all can delegates, and a provider failure fails every rank", "[ccl]") {
  auto exits = test::run_ranks(3, failing_on_rank1(), [](RankEnv& e) {
    std::vector<float> a(1000, 1.f);
    Status first = all_reduce(e.comm, a.data(), a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum).wait();
    HMC_EXPECT(!first.ok(), "rank " + std::to_string(e.rank) + ": the delegated all_reduce succeeded");
    if (e.rank == 1) HMC_EXPECT(first.message().find("HMC_FAKECCL_FAIL_RANK") != std::string::npos, first.to_string());
    // Every later delegated call fails at once, the same way, rather than switching paths.
    Status again = all_gather(e.comm, a.data(), a.data(), 1, DataType::kFloat32).wait(std::chrono::seconds(1));
    HMC_EXPECT(!again.ok() && again.code() != ErrorCode::kTimeout, again.to_string());
    e.comm.abort();
    return 0;
  }, std::chrono::seconds(60));
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
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
  auto exits = test::run_ranks(3, failing_on_rank1(), [](RankEnv& e) {
    int32_t mine = e.rank, all[3] = {-1, -1, -1};
    HMC_EXPECT_OK(gather(e.comm, &mine, all, 1, DataType::kInt32, 0).wait());
    if (e.rank == 0) HMC_EXPECT(all[0] == 0 && all[1] == 1 && all[2] == 2, "gathered values");
    HMC_EXPECT_OK(e.comm.barrier());
    return 0;
  });
  INFO(test::describe(exits));
  REQUIRE(test::all_ok(exits));
}

TEST_CASE("a malformed HMC_CCL is refused clearly", "[ccl][errors]") {
  auto ctx = Context::create({failing_on_rank1("sometimes")});
  REQUIRE_FALSE(ctx.ok());
  CHECK(ctx.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(ctx.status().message(), Catch::Contains("HMC_CCL='sometimes'") && Catch::Contains("'auto' or 'off'"));
}
