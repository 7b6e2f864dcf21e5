// Element-wise reduce and divide for the cpu provider.
//
// Every (dtype, op) pair gets its own instance of a plain loop over __restrict
// pointers so that the compiler vectorises it (this file is built with -O3; the
// loops contain no branches, calls or aliasing). Aliasing the header allows
// (dst == a, dst == b) gets its own loop with fewer pointers instead of breaking
// the restrict promise. The loops are compiled twice: for the baseline ISA, and
// on x86-64 for AVX2 (chosen at init, see HMC_CPU_SIMD), where fp16 uses the F16C
// conversions of cpu_reduce_f16c.cpp. Semantics, shared with the conformance kit:
//  - integers: sum, prod and avg wrap around (computed in the unsigned type);
//  - fp16/bf16: computed in float and rounded once to nearest even, which is the
//    correctly rounded result of one operation (float has >= 2p+2 bits);
//  - min/max of floats: a NaN in either input gives a NaN (IEEE 754-2019
//    minimum/maximum, torch.minimum), so no NaN is ever hidden by a reduction;
//  - avg accumulates like sum; divide finishes it: integers truncate toward
//    zero (any uint64_t divisor), floats give the correctly rounded quotient for
//    every divisor below 2^29 (see divide_float for the rest).
#include "cpu_reduce.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu_state.h"
#include "half.h"

// The loop bodies are forced inline into two wrappers that differ only in the
// instruction set they are compiled for.
#define HMC_CPU_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__)
#define HMC_CPU_WIDE __attribute__((target("avx2,f16c")))
#endif

namespace hmc::cpu {
namespace {

// How a dtype is stored and in which type it is computed.
template <class T>
struct Plain {
  using Storage = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
struct Fp16 {
  using Storage = uint16_t;
  static float load(uint16_t x) { return fp16_to_float(x); }
  static uint16_t store(float x) { return float_to_fp16(x); }
};
struct Bf16 {
  using Storage = uint16_t;
  static float load(uint16_t x) { return bf16_to_float(x); }
  static uint16_t store(float x) { return float_to_bf16(x); }
};

// Integer arithmetic in an unsigned type at least as wide as `unsigned`, so that
// overflow wraps instead of being undefined (and int8 * int8 cannot overflow int).
template <class T>
using Wide = decltype(std::make_unsigned_t<T>{} + 0u);

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    } else {
      return a + b;
    }
  }
};
struct Prod {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    } else {
      return a * b;
    }
  }
};
// `a != a` is true only for a NaN: it makes a NaN in `a` win; a NaN in `b`
// fails the comparison and is returned as the other branch.
struct Min {
  template <class T>
  static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct Max {
  template <class T>
  static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};

template <class C, class Op>
struct Loops {
  using S = typename C::Storage;
  static HMC_CPU_INLINE void out(S* __restrict d, const S* __restrict a, const S* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) d[i] = C::store(Op::apply(C::load(a[i]), C::load(b[i])));
  }
  static HMC_CPU_INLINE void into_a(S* __restrict x, const S* __restrict b, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = C::store(Op::apply(C::load(x[i]), C::load(b[i])));
  }
  static HMC_CPU_INLINE void into_b(S* __restrict x, const S* __restrict a, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = C::store(Op::apply(C::load(a[i]), C::load(x[i])));
  }
  static HMC_CPU_INLINE void self(S* __restrict x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = C::store(Op::apply(C::load(x[i]), C::load(x[i])));
  }
  static HMC_CPU_INLINE void run(void* dst, const void* a, const void* b, size_t n) {
    S* d = static_cast<S*>(dst);
    const S* sa = static_cast<const S*>(a);
    const S* sb = static_cast<const S*>(b);
    if (d == sa && d == sb) {
      self(d, n);
    } else if (d == sa) {
      into_a(d, sb, n);
    } else if (d == sb) {
      into_b(d, sa, n);
    } else {
      out(d, sa, sb, n);
    }
  }
};

template <class C>
HMC_CPU_INLINE void reduce_as(int op, void* d, const void* a, const void* b, size_t n) {
  switch (op) {
    case HMC_OP_SUM:
    case HMC_OP_AVG: Loops<C, Sum>::run(d, a, b, n); break;
    case HMC_OP_PROD: Loops<C, Prod>::run(d, a, b, n); break;
    case HMC_OP_MIN: Loops<C, Min>::run(d, a, b, n); break;
    case HMC_OP_MAX: Loops<C, Max>::run(d, a, b, n); break;
  }
}

// Truncating division; signed values divide their magnitude so that every
// uint64_t divisor (even one above the type's maximum) gives the exact quotient.
template <class T>
HMC_CPU_INLINE void divide_int(void* buf, size_t n, uint64_t d) {
  T* __restrict x = static_cast<T*>(buf);
  if constexpr (std::is_unsigned_v<T>) {
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / d);
  } else {
    for (size_t i = 0; i < n; ++i) {
      const int64_t v = x[i];
      const uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
      const uint64_t q = mag / d;
      x[i] = static_cast<T>(v < 0 ? 0 - q : q);  // wraps back into range modulo 2^64
    }
  }
}

// Rounds to float "to odd": an inexact result gets its last bit set, so that rounding
// it again to a format 2+ bits narrower (bf16) equals one rounding of `q`.
HMC_CPU_INLINE float to_float_odd(double q) {
  const float f = static_cast<float>(q);
  const double back = f;
  const uint32_t inexact = back != q;
  const uint32_t too_far = std::fabs(back) > std::fabs(q);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(f) - (inexact & too_far)) | inexact);
}

// A divisor up to kFloatMax is exact in float, and the float quotient rounded again
// to fp16 (bf16 in the normal range) is still correctly rounded. bf16 results in the
// subnormal range need kFloatMax = 2^16; above it bf16 goes through double and a
// round-to-odd float, fp16 and fp32 through double (a quotient of a divisor past
// 2^29 that lands in fp32's subnormal range can then be one ulp off).
template <class C, uint64_t kFloatMax, bool kOdd>
HMC_CPU_INLINE void divide_float(void* buf, size_t n, uint64_t d) {
  typename C::Storage* __restrict x = static_cast<typename C::Storage*>(buf);
  if (d <= kFloatMax) {
    const float fd = static_cast<float>(d);
    for (size_t i = 0; i < n; ++i) x[i] = C::store(C::load(x[i]) / fd);
  } else {
    const double dd = static_cast<double>(d);
    for (size_t i = 0; i < n; ++i) {
      const double q = static_cast<double>(C::load(x[i])) / dd;
      x[i] = C::store(kOdd ? to_float_odd(q) : static_cast<float>(q));
    }
  }
}

HMC_CPU_INLINE void divide_f64(void* buf, size_t n, uint64_t d) {
  double* __restrict x = static_cast<double*>(buf);
  const double dd = static_cast<double>(d);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / dd;
}

constexpr uint64_t kTwo16 = uint64_t{1} << 16;
constexpr uint64_t kTwo24 = uint64_t{1} << 24;

using ReduceFn = void (*)(int op, void* d, const void* a, const void* b, size_t n);
using DivideFn = void (*)(void* buf, size_t n, uint64_t d);

template <auto F>
void reduce_base(int op, void* d, const void* a, const void* b, size_t n) { F(op, d, a, b, n); }
template <auto F>
void divide_base(void* buf, size_t n, uint64_t d) { F(buf, n, d); }

// One entry per dtype, in HMC_DTYPE_* order.
#define HMC_CPU_REDUCE_TABLE(wrap, fp16)                                                   \
  {wrap<reduce_as<Plain<int8_t>>>,   wrap<reduce_as<Plain<uint8_t>>>,                    \
   wrap<reduce_as<Plain<int32_t>>>,  wrap<reduce_as<Plain<uint32_t>>>,                   \
   wrap<reduce_as<Plain<int64_t>>>,  wrap<reduce_as<Plain<uint64_t>>>,                   \
   fp16,                             wrap<reduce_as<Bf16>>,                              \
   wrap<reduce_as<Plain<float>>>,    wrap<reduce_as<Plain<double>>>}
#define HMC_CPU_DIVIDE_TABLE(wrap)                                                         \
  {wrap<divide_int<int8_t>>,   wrap<divide_int<uint8_t>>,  wrap<divide_int<int32_t>>,    \
   wrap<divide_int<uint32_t>>, wrap<divide_int<int64_t>>,  wrap<divide_int<uint64_t>>,   \
   wrap<divide_float<Fp16, kTwo24, false>>, wrap<divide_float<Bf16, kTwo16, true>>,      \
   wrap<divide_float<Plain<float>, kTwo24, false>>, wrap<divide_f64>}

constexpr ReduceFn kReduceBase[HMC_DTYPE_COUNT] =
    HMC_CPU_REDUCE_TABLE(reduce_base, reduce_base<reduce_as<Fp16>>);
constexpr DivideFn kDivideBase[HMC_DTYPE_COUNT] = HMC_CPU_DIVIDE_TABLE(divide_base);

#if defined(__x86_64__)
template <auto F>
HMC_CPU_WIDE void reduce_wide(int op, void* d, const void* a, const void* b, size_t n) {
  F(op, d, a, b, n);
}
template <auto F>
HMC_CPU_WIDE void divide_wide(void* buf, size_t n, uint64_t d) { F(buf, n, d); }

constexpr ReduceFn kReduceWide[HMC_DTYPE_COUNT] = HMC_CPU_REDUCE_TABLE(reduce_wide, reduce_fp16_f16c);
constexpr DivideFn kDivideWide[HMC_DTYPE_COUNT] = HMC_CPU_DIVIDE_TABLE(divide_wide);
#else
constexpr const ReduceFn* kReduceWide = kReduceBase;
constexpr const DivideFn* kDivideWide = kDivideBase;
#endif

constexpr size_t kDtypeSize[HMC_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

bool misaligned(const void* p, size_t align) {
  return reinterpret_cast<uintptr_t>(p) % align != 0;
}

// Range [p, p + bytes) overlaps [q, q + bytes) without starting at the same address.
bool partial_overlap(const void* p, const void* q, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  const auto y = reinterpret_cast<uintptr_t>(q);
  return x != y && x < y + bytes && y < x + bytes;
}

// Common argument checks; on success stores the byte length in *bytes.
int check_buffer(const char* what, const void* p, size_t count, int dtype, size_t* bytes) {
  if (dtype < 0 || dtype >= HMC_DTYPE_COUNT) {
    return fail(HMC_PROV_ERR_INVALID, "%s: unknown dtype %d", what, dtype);
  }
  const size_t size = kDtypeSize[dtype];
  if (count > SIZE_MAX / size) {
    return fail(HMC_PROV_ERR_INVALID, "%s: count %zu overflows the address space", what, count);
  }
  *bytes = count * size;
  if (count == 0) return HMC_PROV_OK;
  if (p == nullptr) return fail(HMC_PROV_ERR_INVALID, "%s: null buffer with count %zu", what, count);
  if (misaligned(p, size)) {
    return fail(HMC_PROV_ERR_INVALID, "%s: buffer %p is not aligned to its %zu-byte elements",
                what, p, size);
  }
  return HMC_PROV_OK;
}

}  // namespace

int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream) {
  if (op < 0 || op >= HMC_OP_COUNT) return fail(HMC_PROV_ERR_INVALID, "reduce: unknown op %d", op);
  size_t bytes = 0;
  int rc = check_buffer("reduce dst", dst, count, dtype, &bytes);
  if (rc == HMC_PROV_OK) rc = check_buffer("reduce a", a, count, dtype, &bytes);
  if (rc == HMC_PROV_OK) rc = check_buffer("reduce b", b, count, dtype, &bytes);
  if (rc != HMC_PROV_OK || count == 0) return rc;
  if (partial_overlap(dst, a, bytes) || partial_overlap(dst, b, bytes)) {
    return fail(HMC_PROV_ERR_INVALID,
                "reduce: dst overlaps an input without being equal to it (dst %p, a %p, b %p)",
                dst, a, b);
  }
  const auto* s = static_cast<const State*>(state);
  const bool wide = s != nullptr && s->wide;
  (wide ? kReduceWide : kReduceBase)[dtype](op, dst, a, b, count);
  return HMC_PROV_OK;
}

int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream) {
  size_t bytes = 0;
  const int rc = check_buffer("divide", buf, count, dtype, &bytes);
  if (rc != HMC_PROV_OK) return rc;
  if (divisor == 0) return fail(HMC_PROV_ERR_INVALID, "divide: divisor is 0");
  if (count == 0 || divisor == 1) return HMC_PROV_OK;
  const auto* s = static_cast<const State*>(state);
  const bool wide = s != nullptr && s->wide;
  (wide ? kDivideWide : kDivideBase)[dtype](buf, count, divisor);
  return HMC_PROV_OK;
}

bool wide_kernels_supported() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

}  // namespace hmc::cpu
