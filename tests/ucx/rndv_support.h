// What the rendezvous tests over ucx share (test_rndv.cpp, test_split.cpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace ucx_test {

// A source and a destination of `bytes` each: on the heap, or from Context::alloc (with ucx
// the only net provider, its mem_alloc).
struct TwoBuffers {
  TwoBuffers(hmc::Context& ctx, std::size_t bytes, bool heap) {
    if (heap) {
      heap_src.resize(bytes);
      heap_dst.resize(bytes);
      src = heap_src.data();
      dst = heap_dst.data();
      return;
    }
    auto a = ctx.alloc({"cpu", 0}, bytes);
    auto b = ctx.alloc({"cpu", 0}, bytes);
    if (!a.ok() || !b.ok()) {
      error = (a.ok() ? b.status() : a.status()).to_string();
      return;
    }
    src_mem = std::move(a.value());
    dst_mem = std::move(b.value());
    src = static_cast<uint8_t*>(src_mem.data());
    dst = static_cast<uint8_t*>(dst_mem.data());
  }
  std::vector<uint8_t> heap_src, heap_dst;
  hmc::Memory src_mem, dst_mem;
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  std::string error;  // an allocation failed: src and dst are null
};

// Rank 0 sends `bytes` of random data to rank 1 and rank 1 sends them back, from and into
// `src` / `dst` (each `bytes` long); both check what they got.
inline int round_trip(hmc::test::RankEnv& e, uint8_t* src, uint8_t* dst, std::size_t bytes, uint64_t seed) {
  const auto payload = hmc::test::random_bytes(bytes, seed);
  std::memset(dst, 0xA5, bytes);
  const int peer = 1 - e.rank;
  if (e.rank == 0) {
    std::memcpy(src, payload.data(), bytes);
    HMC_EXPECT_OK(e.comm.send(src, bytes, peer, 21));
    HMC_EXPECT_OK(e.comm.recv(dst, bytes, peer, 22));
  } else {
    HMC_EXPECT_OK(e.comm.recv(dst, bytes, peer, 21));
    HMC_EXPECT(std::memcmp(dst, payload.data(), bytes) == 0, "rank 1 received wrong data");
    std::memcpy(src, dst, bytes);
    HMC_EXPECT_OK(e.comm.send(src, bytes, peer, 22));
  }
  HMC_EXPECT(std::memcmp(dst, payload.data(), bytes) == 0, "wrong data after the round trip of " + std::to_string(bytes));
  return 0;
}

// round_trip three times at each size, in fresh buffers (TwoBuffers) per size: where the
// provider refuses a get, the first refusal comes after the key's check, later ones at once.
inline int round_trips(hmc::test::RankEnv& e, std::initializer_list<std::size_t> sizes, bool heap) {
  for (std::size_t bytes : sizes) {
    TwoBuffers b(e.ctx, bytes, heap);
    HMC_EXPECT(b.error.empty(), b.error);
    for (int i = 0; i < 3; ++i)
      if (int rc = round_trip(e, b.src, b.dst, bytes, bytes + i)) return rc;
  }
  return 0;
}

}  // namespace ucx_test
