// Reduce and divide on emulated device memory give the cpu provider's results bit for
// bit (the same kernels, run on the shadows), synchronously and on a stream.
#include <catch2/catch.hpp>

#include "emu_session.h"

using namespace hmc::emu_test;

namespace {

constexpr size_t kDtypeSize[HMC_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
constexpr size_t kCount = 1031;
constexpr size_t kOffset = 64;  // interior pointers

}  // namespace

TEST_CASE("reduce and divide match the cpu provider for every dtype and op", "[emu][reduce]") {
  Plugin emu(HMC_EMU_PLUGIN);
  Plugin cpu(HMC_CPU_PLUGIN);
  REQUIRE(emu.init_rc == HMC_PROV_OK);
  REQUIRE(cpu.init_rc == HMC_PROV_OK);
  void* stream = nullptr;
  REQUIRE(emu.p->stream_create(emu.state, 1, &stream) == 0);
  const size_t max_bytes = kCount * 8 + kOffset;
  char* da = static_cast<char*>(emu.alloc(1, max_bytes)) ;
  char* db = static_cast<char*>(emu.alloc(0, max_bytes));  // the other device: peers
  char* dd = static_cast<char*>(emu.alloc(1, max_bytes));
  uint64_t seed = 1000;
  for (int dtype = 0; dtype < HMC_DTYPE_COUNT; ++dtype) {
    const size_t bytes = kCount * kDtypeSize[dtype];
    for (int op = 0; op < HMC_OP_COUNT; ++op) {
      for (void* s : {static_cast<void*>(nullptr), stream}) {
        INFO("dtype " << dtype << " op " << op << (s ? " on a stream" : ""));
        auto a = random_bytes(bytes, ++seed);
        auto b = random_bytes(bytes, ++seed);
        std::vector<uint8_t> want(bytes, 0xa5);
        REQUIRE(cpu.p->reduce(cpu.state, want.data(), a.data(), b.data(), kCount, dtype, op, nullptr) == 0);
        REQUIRE(emu.p->copy(emu.state, da + kOffset, a.data(), bytes, s) == 0);
        REQUIRE(emu.p->copy(emu.state, db + kOffset, b.data(), bytes, s) == 0);
        REQUIRE(emu.p->reduce(emu.state, dd + kOffset, da + kOffset, db + kOffset, kCount, dtype, op, s) == 0);
        // In place, into a: the same result again.
        REQUIRE(emu.p->reduce(emu.state, da + kOffset, da + kOffset, db + kOffset, kCount, dtype, op, s) == 0);
        REQUIRE(emu.wait(emu.p->stream_query, stream) == 0);
        CHECK(emu.read(dd + kOffset, bytes) == want);
        CHECK(emu.read(da + kOffset, bytes) == want);
      }
    }
    for (uint64_t divisor : {uint64_t{3}, uint64_t{7}, uint64_t{1} << 40}) {
      INFO("divide dtype " << dtype << " by " << divisor);
      auto x = random_bytes(bytes, ++seed);
      auto want = x;
      REQUIRE(cpu.p->divide(cpu.state, want.data(), kCount, dtype, divisor, nullptr) == 0);
      emu.write(dd + kOffset, x);
      REQUIRE(emu.p->divide(emu.state, dd + kOffset, kCount, dtype, divisor, stream) == 0);
      REQUIRE(emu.wait(emu.p->stream_query, stream) == 0);
      CHECK(emu.read(dd + kOffset, bytes) == want);
    }
  }
  // Bad arguments fail on the caller, before anything is queued.
  CHECK(emu.p->reduce(emu.state, dd, da, db, 4, HMC_DTYPE_COUNT, HMC_OP_SUM, stream) == HMC_PROV_ERR_INVALID);
  CHECK(emu.p->reduce(emu.state, dd, da, db, 4, HMC_DTYPE_FP32, HMC_OP_COUNT, stream) == HMC_PROV_ERR_INVALID);
  CHECK(emu.p->divide(emu.state, dd, 4, HMC_DTYPE_FP32, 0, stream) == HMC_PROV_ERR_INVALID);
  CHECK(emu.p->reduce(emu.state, dd, da, db + max_bytes - 8, 4, HMC_DTYPE_FP32, HMC_OP_SUM, nullptr) ==
        HMC_PROV_ERR_INVALID);  // b runs past its allocation
  CHECK(emu.p->stream_destroy(emu.state, stream) == 0);
  emu.free(1, da);
  emu.free(0, db);
  emu.free(1, dd);
}
