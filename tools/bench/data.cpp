// Known data for -c: small integers chosen so that every dtype holds every input and every
// result exactly (sums stay within int8 and bf16 for up to 64 ranks, products are +-2,
// averages divide evenly), so outputs compare exactly; only avg on floats gets a tolerance
// (an implementation may scale before it sums).
#include <cmath>
#include <cstring>

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
  for (std::size_t i = 0; i < elems; ++i) store_elem(d.dtype, host, i, input_value(d, rank, i));
}

void fill_poison(void* host, std::size_t bytes) { std::memset(host, kPoison, bytes); }

uint64_t count_wrong(const DataSpec& d, const Layout& lay, int rank, const void* host) {
  const std::size_t c = lay.count;
  const bool root = rank == d.root;
  uint64_t wrong = 0;
  auto expect = [&](std::size_t at, double want) { wrong += !matches(d, load_elem(d.dtype, host, at), want); };
  switch (d.coll) {
    case Coll::kAllReduce:
      for (std::size_t i = 0; i < c; ++i) expect(i, reduce_expected(d, i));
      break;
    case Coll::kReduce:
      if (root)
        for (std::size_t i = 0; i < c; ++i) expect(i, reduce_expected(d, i));
      break;
    case Coll::kReduceScatter:
      for (std::size_t i = 0; i < c; ++i) expect(i, reduce_expected(d, rank * c + i));
      break;
    case Coll::kBroadcast:
      for (std::size_t i = 0; i < c; ++i) expect(i, input_value(d, d.root, i));
      break;
    case Coll::kAllGather: case Coll::kGather:
      if (d.coll == Coll::kAllGather || root)
        for (int j = 0; j < d.n; ++j)
          for (std::size_t i = 0; i < c; ++i) expect(j * c + i, input_value(d, j, i));
      break;
    case Coll::kScatter:
      for (std::size_t i = 0; i < c; ++i) expect(i, input_value(d, d.root, rank * c + i));
      break;
    case Coll::kAllToAll:
      for (int j = 0; j < d.n; ++j)
        for (std::size_t i = 0; i < c; ++i) expect(j * c + i, input_value(d, j, rank * c + i));
      break;
    case Coll::kSendRecv:
      for (std::size_t i = 0; i < c; ++i) expect(i, input_value(d, (rank + d.n - 1) % d.n, i));
      break;
    case Coll::kBarrier: break;
  }
  return wrong;
}

}  // namespace hmc::bench
