// fp16 reduce for x86-64 CPUs with F16C and AVX2: the hardware converts eight
// halves to floats and back (round to nearest even, subnormals exact, NaN kept)
// in one instruction each, several times faster than the portable bit-trick
// conversion. The float arithmetic and the NaN rule of min/max are the same as in
// cpu_reduce.cpp, so both paths give identical results. Called only when
// wide_kernels_supported(); compiled for that ISA by function attributes.
#include "cpu_reduce.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstring>

#include "hmc/provider/common.h"

#define HMC_CPU_F16C __attribute__((target("avx2,f16c"), always_inline)) inline

namespace hmc::cpu {
namespace {

struct VSum {
  HMC_CPU_F16C static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct VProd {
  HMC_CPU_F16C static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
// (a < b || a != a) ? a : b, as the portable Min: a NaN on either side wins.
struct VMin {
  HMC_CPU_F16C static __m256 apply(__m256 a, __m256 b) {
    const __m256 pick_a = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(b, a, pick_a);
  }
};
struct VMax {
  HMC_CPU_F16C static __m256 apply(__m256 a, __m256 b) {
    const __m256 pick_a = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_blendv_ps(b, a, pick_a);
  }
};

template <class Op>
HMC_CPU_F16C void eight(uint16_t* d, const uint16_t* a, const uint16_t* b) {
  const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
  const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm256_cvtps_ph(Op::apply(x, y), _MM_FROUND_TO_NEAREST_INT));
}

// Each step loads both inputs before it stores, so dst may equal a or b.
template <class Op>
__attribute__((target("avx2,f16c"))) void run(uint16_t* d, const uint16_t* a, const uint16_t* b,
                                              size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) eight<Op>(d + i, a + i, b + i);
  if (i < n) {  // the last few elements go through a zero-padded block of eight
    uint16_t ta[8] = {}, tb[8] = {}, td[8];
    std::memcpy(ta, a + i, (n - i) * 2);
    std::memcpy(tb, b + i, (n - i) * 2);
    eight<Op>(td, ta, tb);
    std::memcpy(d + i, td, (n - i) * 2);
  }
}

}  // namespace

void reduce_fp16_f16c(int op, void* dst, const void* a, const void* b, size_t count) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  switch (op) {
    case HMC_OP_SUM:
    case HMC_OP_AVG: run<VSum>(d, x, y, count); break;
    case HMC_OP_PROD: run<VProd>(d, x, y, count); break;
    case HMC_OP_MIN: run<VMin>(d, x, y, count); break;
    case HMC_OP_MAX: run<VMax>(d, x, y, count); break;
  }
}

}  // namespace hmc::cpu

#endif  // __x86_64__
