// Element-wise reduce and divide kernels of the cpu provider (every dtype x op).
#pragma once

#include <cstddef>
#include <cstdint>

namespace hmc::cpu {

int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream);
int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream);

// True when this CPU runs the AVX2/F16C kernels (x86-64 with both extensions).
bool wide_kernels_supported();

#if defined(__x86_64__)
// fp16 reduce with the F16C conversion instructions; same results as the portable
// loops (IEEE round to nearest even, subnormals kept, NaN propagates).
void reduce_fp16_f16c(int op, void* dst, const void* a, const void* b, size_t count);
#endif

}  // namespace hmc::cpu
