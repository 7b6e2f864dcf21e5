// Plan: what an algorithm builder needs to lay a collective out as a Schedule.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "collectives/schedule.h"
#include "collectives/scratch.h"
#include "collectives/tags.h"
#include "hmc/types.h"

namespace hmc::coll {

// A range of elements.
struct Range {
  std::size_t off = 0;
  std::size_t len = 0;
};

// Part i of `total` elements cut into `parts` nearly equal parts (the first total % parts
// parts are one element longer), so every rank computes the same partition.
inline Range part(std::size_t total, std::size_t parts, std::size_t i) {
  std::size_t q = total / parts, rem = total % parts;
  return {i * q + std::min(i, rem), q + (i < rem ? 1 : 0)};
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

struct Plan {
  Schedule& s;
  Scratch& scratch;
  int rank;
  int size;
  std::size_t esz;    // bytes per element
  std::size_t chunk;  // elements per chunk (HMC_COLL_CHUNK / esz, at least 1)
  bool avg;           // divide by size once the sum is complete

  uint8_t* at(const void* base, std::size_t elems) const {
    return static_cast<uint8_t*>(const_cast<void*>(base)) + elems * esz;
  }
  std::size_t bytes(std::size_t elems) const { return elems * esz; }
  // A range of `len` elements cut into chunks of at most `chunk` elements, nearly equal.
  std::size_t chunks(std::size_t len) const {
    if (len == 0) return 0;
    return std::min<std::size_t>((len + chunk - 1) / chunk, kMaxChunks - 1);
  }
  Range chunk_of(std::size_t len, std::size_t c) const { return part(len, chunks(len), c); }
  // Scratch of elems * times + plus elements: an error, not a wrapped size, where that
  // many bytes do not fit (the argument checks bound the user's sizes, not an
  // algorithm's multiple of them).
  Result<uint8_t*> scratch_elems(std::size_t elems, std::size_t times = 1, std::size_t plus = 0) {
    std::size_t n = 0, bytes = 0;
    if (__builtin_mul_overflow(elems, times, &n) || __builtin_add_overflow(n, plus, &n) ||
        __builtin_mul_overflow(n, esz, &bytes))
      return Status(ErrorCode::kNoMemory, "collective scratch of " + std::to_string(elems) + " x " +
                                              std::to_string(times) + " + " + std::to_string(plus) +
                                              " elements does not fit in memory");
    return scratch.get(bytes);
  }
};

}  // namespace hmc::coll
