// What the parent and a child of hmc-conformance-net exchange (same binary, same host).
#pragma once

#include <cstdint>

#include "hmc/provider/net.h"

namespace hmc_conformance {

inline constexpr size_t kStreamMsg = 8 << 20;    // stream mode message size
inline constexpr uint64_t kPutSalt = 77;         // random data the put child writes
inline constexpr uint64_t kOtherSalt = 78;       // ... into the other region
inline constexpr uint64_t kOtherLen = 4096;      // ... at its offset 0
inline constexpr uint32_t kMarker = 0x4b52414d;  // "MARK", sent right behind the put
inline constexpr int kLastFlood = 3000;          // last mode: 8-byte messages it takes first
inline constexpr int kLastCount = 41;            // last mode: messages before fini (the last 8 B)
inline constexpr size_t kLastSizes[] = {8, 4096, 65536, 1 << 20};

// Last mode's message k: kLastSizes[k % 4] bytes, byte i = (k * 31 + i) & 0xff.
inline size_t last_size(int k) { return kLastSizes[k % 4]; }
inline char last_byte(int k, size_t i) { return static_cast<char>((static_cast<size_t>(k) * 31 + i) & 0xff); }

// Parent -> put child. Phase 1: `len` bytes at `offset` of the region, the
// marker right behind, then kOtherLen bytes into the other region (the
// provider may now cache what it needs for it). Phase 2, after the parent
// deregistered the other region and registered its memory again: the other
// region's old key (stale), and for every byte of `rkey` a copy with that byte
// changed, each put 64 bytes across the end of the region (region_len - 32).
struct PutPlan {
  uint64_t offset;
  uint64_t len;
  uint64_t region_len;
  uint32_t rkey_len;
  uint32_t other_rkey_len;
  uint8_t rkey[HMC_NET_RKEY_MAX];
  uint8_t other_rkey[HMC_NET_RKEY_MAX];
};

struct PutReport {  // phase 1
  int32_t put_rc;
  int32_t other_rc;
};

// Shrink mode (the child owns the region): the child's region is kShrinkLen bytes of a
// shared file without seals, whose key it sends first; the parent puts kShrinkPut bytes
// of kShrinkSalt data at offset 0 and sends kMarker; the child checks them, shrinks the
// file to nothing and answers kMarker; the parent's next put must fail.
inline constexpr uint64_t kShrinkLen = 1 << 20;
inline constexpr uint64_t kShrinkPut = 64 << 10;
inline constexpr uint64_t kShrinkSalt = 79;

struct ShrinkKey {
  uint32_t rkey_len;
  uint8_t rkey[HMC_NET_RKEY_MAX];
};

struct StaleReport {  // phase 2
  int32_t stale_rc;
  uint32_t changed_tried;
  uint32_t changed_accepted;  // puts with a changed key that did not fail
  uint32_t first_accepted;    // the byte whose change was accepted first
};

}  // namespace hmc_conformance
