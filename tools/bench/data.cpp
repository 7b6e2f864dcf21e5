// Known data for -c: small integers chosen so that every dtype holds every input and every
// result exactly (sums stay within int8 and bf16 for up to 64 ranks, products are +-2,
// averages divide evenly), so outputs compare exactly; only avg on floats gets a tolerance
// (an implementation may scale before it sums).
//
// Every input and expected value is periodic in the element index (period_of), so a fill
// writes one period and copies it, and a check compares whole periods with memcmp and looks
// at single elements only where a period differs: 1 GiB takes a few memcpy's, not 2^28 calls.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "bench.h"
#include "dtype_io.h"

namespace hmc::bench {
namespace {

constexpr unsigned char kPoison = 0xa5;  // decodes to no value the data below produces

// Ranks pair up with +1/-1 (an odd last rank gets 0), so offsets sum to zero over ranks.
int avg_offset(int rank, int n) {
  if (n % 2 == 1 && rank == n - 1) return 0;
  return rank % 2 == 0 ? 1 : -1;
}

double reduce_expected(const DataSpec& d, std::size_t i) {
  if (d.op == ReduceOp::kAvg) return 2.0 + static_cast<double>((i + d.seed) % 5);
  double acc = input_value(d, 0, i);
  for (int r = 1; r < d.n; ++r) {
    double v = input_value(d, r, i);
    switch (d.op) {
      case ReduceOp::kSum: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::fmin(acc, v); break;
      case ReduceOp::kMax: acc = std::fmax(acc, v); break;
      case ReduceOp::kAvg: break;
    }
  }
  return acc;
}

bool matches(const DataSpec& d, double got, double want) {
  if (d.op == ReduceOp::kAvg && is_float(d.dtype) && traits(d.coll).reduces)
    return std::fabs(got - want) <= epsilon(d.dtype) * (d.n + 2) * std::fabs(want);
  return got == want;  // NaN (a poisoned float) never matches
}

// The values below repeat every period_of(d) elements: lcm of the moduli (3, 5, 7, 50, 97, n).
std::size_t period_of(const DataSpec& d) { return std::lcm<std::size_t>(3 * 7 * 50 * 97, std::max(d.n, 1)); }

// Wrong elements of out[at, at + c) where out[at + i] should be want(i).
template <class F>
uint64_t check_run(const DataSpec& d, const void* host, std::size_t at, std::size_t c, F want) {
  const std::size_t e = dtype_size(d.dtype), block = std::min(c, period_of(d));
  std::vector<unsigned char> pattern(block * e);
  for (std::size_t i = 0; i < block; ++i) store_elem(d.dtype, pattern.data(), i, want(i));
  const auto* out = static_cast<const unsigned char*>(host) + at * e;
  uint64_t wrong = 0;
  for (std::size_t i0 = 0; i0 < c; i0 += block) {
    const std::size_t n = std::min(block, c - i0);
    if (std::memcmp(out + i0 * e, pattern.data(), n * e) == 0) continue;  // equal bytes: equal values
    for (std::size_t i = i0; i < i0 + n; ++i) wrong += !matches(d, load_elem(d.dtype, host, at + i), want(i));
  }
  return wrong;
}

}  // namespace

double input_value(const DataSpec& d, int rank, std::size_t i) {
  const std::size_t s = d.seed;
  const bool sign = is_signed_or_float(d.dtype);
  if (!traits(d.coll).reduces) return static_cast<double>((rank * 131 + i * 7 + s) % 97);  // fits int8 and bf16
  switch (d.op) {
    case ReduceOp::kSum: return static_cast<double>((i * 31 + rank * 17 + s) % 3) - (sign ? 1 : 0);
    case ReduceOp::kProd: {
      double v = (i + s) % d.n == static_cast<std::size_t>(rank) ? 2 : 1;
      return sign && (i + 2 * rank + s) % 7 == 0 ? -v : v;
    }
    case ReduceOp::kMin: case ReduceOp::kMax:
      return static_cast<double>((i * 7 + rank * 13 + s) % 50) - (sign ? 25 : 0);
    case ReduceOp::kAvg: return 2.0 + static_cast<double>((i + s) % 5) + avg_offset(rank, d.n);
  }
  return 0;
}

void fill_input(const DataSpec& d, int rank, void* host, std::size_t elems) {
  const std::size_t e = dtype_size(d.dtype), p = std::min(elems, period_of(d));
  for (std::size_t i = 0; i < p; ++i) store_elem(d.dtype, host, i, input_value(d, rank, i));
  auto* out = static_cast<unsigned char*>(host);
  for (std::size_t done = p; done < elems;) {  // whole periods, doubling
    const std::size_t n = std::min(done, elems - done);
    std::memcpy(out + done * e, out, n * e);
    done += n;
  }
}

void fill_poison(void* host, std::size_t bytes) { std::memset(host, kPoison, bytes); }

uint64_t count_wrong(const DataSpec& d, const Layout& lay, int rank, const void* host) {
  const std::size_t c = lay.count;
  const bool root = rank == d.root;
  auto input = [&](int from, std::size_t offset) { return [&d, from, offset](std::size_t i) { return input_value(d, from, offset + i); }; };
  auto reduced = [&](std::size_t offset) { return [&d, offset](std::size_t i) { return reduce_expected(d, offset + i); }; };
  uint64_t wrong = 0;
  switch (d.coll) {
    case Coll::kAllReduce: wrong = check_run(d, host, 0, c, reduced(0)); break;
    case Coll::kReduce:
      if (root) wrong = check_run(d, host, 0, c, reduced(0));
      break;
    case Coll::kReduceScatter: wrong = check_run(d, host, 0, c, reduced(rank * c)); break;
    case Coll::kBroadcast: wrong = check_run(d, host, 0, c, input(d.root, 0)); break;
    case Coll::kAllGather: case Coll::kGather:
      if (d.coll == Coll::kAllGather || root)
        for (int j = 0; j < d.n; ++j) wrong += check_run(d, host, j * c, c, input(j, 0));
      break;
    case Coll::kScatter: wrong = check_run(d, host, 0, c, input(d.root, rank * c)); break;
    case Coll::kAllToAll:
      for (int j = 0; j < d.n; ++j) wrong += check_run(d, host, j * c, c, input(j, rank * c));
      break;
    case Coll::kSendRecv: wrong = check_run(d, host, 0, c, input((rank + d.n - 1) % d.n, 0)); break;
    case Coll::kBarrier: break;
  }
  return wrong;
}

}  // namespace hmc::bench
