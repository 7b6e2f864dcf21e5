// What the parent and a child of hmc-conformance-net exchange (same binary, same host).
#pragma once

#include <cstdint>

#include "hmc/provider/net.h"

namespace hmc_conformance {

inline constexpr size_t kStreamMsg = 8 << 20;    // stream mode message size
inline constexpr uint64_t kPutSalt = 77;         // random data the put child writes
inline constexpr uint32_t kMarker = 0x4b52414d;  // "MARK", sent right behind the put

struct PutPlan {
  uint64_t offset;
  uint64_t len;
  uint32_t rkey_len;
  uint32_t stale_rkey_len;
  uint8_t rkey[HMC_NET_RKEY_MAX];
  uint8_t stale_rkey[HMC_NET_RKEY_MAX];  // a deregistered region: must be refused
};

struct PutReport {
  int32_t put_rc;
  int32_t stale_rc;
};

}  // namespace hmc_conformance
