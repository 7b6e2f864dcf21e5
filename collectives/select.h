// Which algorithm a collective runs: CollOptions::algorithm, else HMC_ALGO, else a rule on
// message size and rank count (small messages: latency algorithms; large: ring/pipelines).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "hmc/status.h"

namespace hmc::coll {

enum class CollKind : uint32_t {
  kAllReduce, kReduce, kBroadcast, kAllGather, kReduceScatter, kGather, kScatter, kAllToAll, kAllToAllV, kBarrier
};
inline constexpr uint32_t kNumCollKinds = 10;
const char* coll_kind_name(CollKind k);

enum class Algo : int32_t {
  kAuto,
  kRing,      // ring (all_reduce, all_gather, reduce_scatter); pipelined chain (broadcast, reduce)
  kRd,        // recursive doubling (all_reduce, all_gather); recursive halving (reduce_scatter)
  kRhd,       // recursive halving + doubling, Rabenseifner (all_reduce)
  kTree,      // binomial tree (broadcast, reduce; all_reduce as reduce + broadcast)
  kPairwise,  // all_to_all: one peer pair per step
  kLinear,    // all_to_all: every peer at once; gather, scatter: root talks to each rank
  kDissemination,  // barrier
};
const char* algo_name(Algo a);

struct CollSettings;  // settings.h

// `bytes`: the message size the rule looks at (see docs/collectives.md).
Result<Algo> choose_algorithm(const CollSettings& settings, CollKind kind, const std::string& requested,
                              std::size_t bytes, int size);

inline bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace hmc::coll
