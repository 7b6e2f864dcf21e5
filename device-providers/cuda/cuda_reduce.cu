// Element-wise reduce and divide kernels of the cuda provider, and their entries.
//
// Semantics are the cpu provider's, bit for bit (device-providers/cpu/cpu_reduce.cpp
// and half.h define them; the conformance kit checks both against its own reference):
//  - integers: sum, prod and avg wrap around (computed in an unsigned type at least
//    as wide as unsigned int); divide truncates toward zero for any uint64_t divisor;
//  - fp16/bf16: loaded exactly into float, one float operation, rounded once to
//    nearest even (fp16 through cvt.f32.f16/cvt.rn.f16.f32 with NaNs handled on their
//    bits, bf16 with integer rounding);
//    subnormals kept (built without fast math: -ftz=false, IEEE division, no FMA
//    contraction);
//  - min/max: (a < b || a != a) ? a : b, so a NaN in either input gives a NaN;
//  - divide of floats: float division for divisors up to 2^24 (bf16: 2^16), above
//    that double division then float (bf16: round to odd, then bf16), fp64 divides
//    in double, exactly like the cpu provider.
// NaN payloads are not portable: a GPU sum or product of a NaN gives the canonical
// NaN where x86 keeps the input's payload and sign; NaN stays NaN everywhere.
//
// Kernel: one template, instantiated once per (dtype, op) and per dtype for divide.
// A grid-stride loop moves 16-byte vectors (uint4) when dst, a and b are all 16-byte
// aligned, four vectors per thread per step to keep enough loads in flight, then the
// tail (or everything, when misaligned) element by element. Each thread reads an
// element before writing it, so dst may equal a or b. Grid: 512 threads per block,
// at most HMC_CUDA_REDUCE_BLOCKS blocks per multiprocessor.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda_state.h"

namespace hmc::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

// ---- how each dtype is stored and computed --------------------------------------

template <class T>
struct Plain {
  using S = T;
  __device__ __forceinline__ static T load(T x) { return x; }
  __device__ __forceinline__ static T store(T x) { return x; }
};

struct Fp16 {
  using S = uint16_t;
  // Exact: the hardware conversion (cvt.f32.f16) for numbers, infinities and
  // subnormals; a NaN is built from its bits so that its sign and payload survive
  // (as the cpu provider's conversion keeps them).
  __device__ __forceinline__ static float load(uint16_t h) {
    if ((h & 0x7fffu) > 0x7c00u) {
      return __uint_as_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u |
                             (static_cast<uint32_t>(h & 0x3ffu) << 13));
    }
    return __half2float(__ushort_as_half(h));
  }
  // Round to nearest even by the hardware conversion; a NaN becomes the quiet NaN
  // 0x7e00 with its sign (what the cpu provider writes).
  __device__ __forceinline__ static uint16_t store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
  }
};

struct Bf16 {
  using S = uint16_t;
  __device__ __forceinline__ static float load(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
  // Round to nearest even on the bits; a NaN keeps its top bits with the quiet bit set.
  __device__ __forceinline__ static uint16_t store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

// ---- operations --------------------------------------------------------------------

template <class T>
using Wide = decltype(std::make_unsigned_t<T>{} + 0u);

struct Sum {
  template <class T>
  __device__ __forceinline__ static T apply(T a, T b) {
    if constexpr (std::is_same_v<T, float>) {
      return __fadd_rn(a, b);
    } else if constexpr (std::is_same_v<T, double>) {
      return __dadd_rn(a, b);
    } else {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    }
  }
};
struct Prod {
  template <class T>
  __device__ __forceinline__ static T apply(T a, T b) {
    if constexpr (std::is_same_v<T, float>) {
      return __fmul_rn(a, b);
    } else if constexpr (std::is_same_v<T, double>) {
      return __dmul_rn(a, b);
    } else {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    }
  }
};
// `a != a` holds only for a NaN: a NaN in `a` wins; a NaN in `b` fails `a < b`.
struct Min {
  template <class T>
  __device__ __forceinline__ static T apply(T a, T b) { return (a < b || a != a) ? a : b; }
};
struct Max {
  template <class T>
  __device__ __forceinline__ static T apply(T a, T b) { return (a > b || a != a) ? a : b; }
};

template <class Cv, class Op>
struct ReduceFn {
  using S = typename Cv::S;
  static constexpr bool kBinary = true;
  __device__ __forceinline__ S operator()(S x, S y) const { return Cv::store(Op::apply(Cv::load(x), Cv::load(y))); }
};

template <class T>
struct DivideInt {
  using S = T;
  static constexpr bool kBinary = false;
  uint64_t d;
  __device__ __forceinline__ T operator()(T x, T) const {
    // Divide the magnitude: exact for every divisor, the most negative value included.
    // Up to 32-bit types divide in 32 bits (a magnitude < 2^32 over a divisor >= 2^32
    // is 0), which is much cheaper on the GPU than a 64-bit division.
    if constexpr (sizeof(T) <= 4) {
      if (d > 0xffffffffull) return 0;
      const uint32_t d32 = static_cast<uint32_t>(d);
      if constexpr (std::is_unsigned_v<T>) {
        return static_cast<T>(static_cast<uint32_t>(x) / d32);
      } else {
        const int32_t v = x;
        const uint32_t mag = v < 0 ? 0u - static_cast<uint32_t>(v) : static_cast<uint32_t>(v);
        const uint32_t q = mag / d32;
        return static_cast<T>(v < 0 ? 0u - q : q);
      }
    } else if constexpr (std::is_unsigned_v<T>) {
      return static_cast<T>(x / d);
    } else {
      const int64_t v = x;
      const uint64_t mag = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
      const uint64_t q = mag / d;
      return static_cast<T>(v < 0 ? 0 - q : q);
    }
  }
};

// Float rounding "to odd": an inexact result gets its last bit set, so that rounding it
// again to bf16 equals one rounding of q.
__device__ __forceinline__ float to_float_odd(double q) {
  const float f = __double2float_rn(q);
  const double back = f;
  const uint32_t inexact = back != q;
  const uint32_t too_far = fabs(back) > fabs(q);
  return __uint_as_float((__float_as_uint(f) - (inexact & too_far)) | inexact);
}

template <class Cv, uint64_t kFloatMax, bool kOdd>
struct DivideFloat {
  using S = typename Cv::S;
  static constexpr bool kBinary = false;
  uint64_t d;
  float fd;   // d, exact when d <= kFloatMax
  double dd;  // d rounded to double, as the cpu provider converts it
  __device__ __forceinline__ S operator()(S x, S) const {
    if (d <= kFloatMax) return Cv::store(__fdiv_rn(Cv::load(x), fd));
    const double q = __ddiv_rn(static_cast<double>(Cv::load(x)), dd);
    return Cv::store(kOdd ? to_float_odd(q) : __double2float_rn(q));
  }
};

struct DivideF64 {
  using S = double;
  static constexpr bool kBinary = false;
  double dd;
  __device__ __forceinline__ double operator()(double x, double) const { return __ddiv_rn(x, dd); }
};

// ---- the kernel ---------------------------------------------------------------------

template <class F>
__global__ void __launch_bounds__(kThreads)
elementwise(typename F::S* dst, const typename F::S* a, const typename F::S* b, size_t n, size_t nvec, F f) {
  using S = typename F::S;
  constexpr int kV = 16 / sizeof(S);
  union Vec {
    uint4 u;
    S s[kV];
  };
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  const uint4* va = reinterpret_cast<const uint4*>(a);
  const uint4* vb = reinterpret_cast<const uint4*>(b);
  uint4* vd = reinterpret_cast<uint4*>(dst);
  size_t i = first;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    Vec x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u].u = va[i + u * stride];
      if constexpr (F::kBinary) y[u].u = vb[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < kV; ++k) x[u].s[k] = f(x[u].s[k], F::kBinary ? y[u].s[k] : x[u].s[k]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) vd[i + u * stride] = x[u].u;
  }
  for (; i < nvec; i += stride) {
    Vec x, y;
    x.u = va[i];
    if constexpr (F::kBinary) y.u = vb[i];
#pragma unroll
    for (int k = 0; k < kV; ++k) x.s[k] = f(x.s[k], F::kBinary ? y.s[k] : x.s[k]);
    vd[i] = x.u;
  }
  for (size_t j = nvec * kV + first; j < n; j += stride) dst[j] = f(a[j], F::kBinary ? b[j] : a[j]);
}

template <class F>
cudaError_t launch(void* dst, const void* a, const void* b, size_t n, const F& fn, int max_blocks,
                   cudaStream_t stream) {
  using S = typename F::S;
  constexpr size_t kV = 16 / sizeof(S);
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  const bool aligned = ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(x) |
                         reinterpret_cast<uintptr_t>(y)) % 16) == 0;
  size_t nvec = aligned ? n / kV : 0;
  const size_t items = nvec + (n - nvec * kV);  // vectors, then single elements
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > static_cast<size_t>(max_blocks)) blocks = static_cast<size_t>(max_blocks);
  if (blocks == 0) blocks = 1;
  F f = fn;
  void* args[] = {&d, &x, &y, &n, &nvec, &f};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&elementwise<F>), dim3(static_cast<unsigned>(blocks)),
                          dim3(kThreads), args, 0, stream);
}

using ReduceLauncher = cudaError_t (*)(int op, void* dst, const void* a, const void* b, size_t n, int max_blocks,
                                       cudaStream_t stream);

template <class Cv>
cudaError_t reduce_as(int op, void* dst, const void* a, const void* b, size_t n, int max_blocks,
                      cudaStream_t stream) {
  switch (op) {
    case HMC_OP_SUM:
    case HMC_OP_AVG: return launch(dst, a, b, n, ReduceFn<Cv, Sum>{}, max_blocks, stream);
    case HMC_OP_PROD: return launch(dst, a, b, n, ReduceFn<Cv, Prod>{}, max_blocks, stream);
    case HMC_OP_MIN: return launch(dst, a, b, n, ReduceFn<Cv, Min>{}, max_blocks, stream);
    case HMC_OP_MAX: return launch(dst, a, b, n, ReduceFn<Cv, Max>{}, max_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

constexpr ReduceLauncher kReduce[HMC_DTYPE_COUNT] = {
    reduce_as<Plain<int8_t>>,  reduce_as<Plain<uint8_t>>, reduce_as<Plain<int32_t>>, reduce_as<Plain<uint32_t>>,
    reduce_as<Plain<int64_t>>, reduce_as<Plain<uint64_t>>, reduce_as<Fp16>,           reduce_as<Bf16>,
    reduce_as<Plain<float>>,   reduce_as<Plain<double>>};

template <class T>
cudaError_t divide_int(void* buf, size_t n, uint64_t d, int max_blocks, cudaStream_t stream) {
  return launch(buf, buf, buf, n, DivideInt<T>{d}, max_blocks, stream);
}

template <class Cv, uint64_t kFloatMax, bool kOdd>
cudaError_t divide_float(void* buf, size_t n, uint64_t d, int max_blocks, cudaStream_t stream) {
  const DivideFloat<Cv, kFloatMax, kOdd> f{d, static_cast<float>(d), static_cast<double>(d)};
  return launch(buf, buf, buf, n, f, max_blocks, stream);
}

cudaError_t divide_f64(void* buf, size_t n, uint64_t d, int max_blocks, cudaStream_t stream) {
  return launch(buf, buf, buf, n, DivideF64{static_cast<double>(d)}, max_blocks, stream);
}

using DivideLauncher = cudaError_t (*)(void* buf, size_t n, uint64_t d, int max_blocks, cudaStream_t stream);

constexpr uint64_t kTwo16 = uint64_t{1} << 16;
constexpr uint64_t kTwo24 = uint64_t{1} << 24;

constexpr DivideLauncher kDivide[HMC_DTYPE_COUNT] = {
    divide_int<int8_t>,  divide_int<uint8_t>,  divide_int<int32_t>, divide_int<uint32_t>,
    divide_int<int64_t>, divide_int<uint64_t>, divide_float<Fp16, kTwo24, false>,
    divide_float<Bf16, kTwo16, true>, divide_float<Plain<float>, kTwo24, false>, divide_f64};

constexpr size_t kDtypeSize[HMC_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

// ---- argument checks -----------------------------------------------------------------

bool partial_overlap(const void* p, const void* q, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  const auto y = reinterpret_cast<uintptr_t>(q);
  return x != y && x < y + bytes && y < x + bytes;
}

int check_buffer(const char* what, const void* p, size_t count, int dtype, size_t* bytes) {
  if (dtype < 0 || dtype >= HMC_DTYPE_COUNT) return fail(HMC_PROV_ERR_INVALID, "%s: unknown dtype %d", what, dtype);
  const size_t size = kDtypeSize[dtype];
  if (count > SIZE_MAX / size) {
    return fail(HMC_PROV_ERR_INVALID, "%s: count %zu overflows the address space", what, count);
  }
  *bytes = count * size;
  if (count == 0) return HMC_PROV_OK;
  if (p == nullptr) return fail(HMC_PROV_ERR_INVALID, "%s: null buffer with count %zu", what, count);
  if (reinterpret_cast<uintptr_t>(p) % size != 0) {
    return fail(HMC_PROV_ERR_INVALID, "%s: buffer %p is not aligned to its %zu-byte elements", what, p, size);
  }
  return HMC_PROV_OK;
}

// The GPU must reach the buffer: device, managed or pinned (mapped) host memory.
int check_reachable(const void* p, const char* what, PointerInfo* info) {
  if (const int rc = pointer_info(p, what, info); rc != HMC_PROV_OK) return rc;
  if (info->type == cudaMemoryTypeUnregistered) {
    return fail(HMC_PROV_ERR_INVALID, "%s: %p is pageable host memory, which the kernels cannot reach", what, p);
  }
  return HMC_PROV_OK;
}

// The device that runs the kernel (the stream's, else the buffer's), made current.
int enter(State* s, void* stream, const PointerInfo& buffer, const char* what, DeviceGuard* guard, int* device) {
  if (stream != nullptr) {
    if (const int rc = stream_device(stream, what, device); rc != HMC_PROV_OK) return rc;
  } else {
    *device = buffer.device;
  }
  if (const int rc = check_device(s, *device, what); rc != HMC_PROV_OK) return rc;
  return guard->use(*device, what);
}

int finish(cudaError_t err, void* stream, const char* what) {
  if (err != cudaSuccess) return fail_cuda(err, what, "cudaLaunchKernel");
  if (stream == nullptr) {
    err = cudaStreamSynchronize(cudaStreamPerThread);
    if (err != cudaSuccess) return fail_cuda(err, what, "cudaStreamSynchronize");
  }
  return HMC_PROV_OK;
}

}  // namespace

int load_kernels(State* s, int device) {
  {
    std::lock_guard lock(s->mutex);
    if (s->devices[static_cast<size_t>(device)].kernels_loaded) return HMC_PROV_OK;
  }
  // Launches of zero elements: nothing is read or written, but each kernel gets loaded.
  cudaError_t err = cudaSuccess;
  for (int t = 0; t < HMC_DTYPE_COUNT && err == cudaSuccess; ++t) {
    for (int op = 0; op < HMC_OP_COUNT && err == cudaSuccess; ++op)
      err = kReduce[t](op, nullptr, nullptr, nullptr, 0, 1, cudaStreamPerThread);
    if (err == cudaSuccess) err = kDivide[t](nullptr, 0, 2, 1, cudaStreamPerThread);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess) return fail_cuda(err, "loading the reduce kernels", "cudaLaunchKernel");
  std::lock_guard lock(s->mutex);
  s->devices[static_cast<size_t>(device)].kernels_loaded = true;
  return HMC_PROV_OK;
}

int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream) {
  auto* s = static_cast<State*>(state);
  if (op < 0 || op >= HMC_OP_COUNT) return fail(HMC_PROV_ERR_INVALID, "reduce: unknown op %d", op);
  size_t bytes = 0;
  int rc = check_buffer("reduce dst", dst, count, dtype, &bytes);
  if (rc == HMC_PROV_OK) rc = check_buffer("reduce a", a, count, dtype, &bytes);
  if (rc == HMC_PROV_OK) rc = check_buffer("reduce b", b, count, dtype, &bytes);
  if (rc != HMC_PROV_OK || count == 0) return rc;
  if (partial_overlap(dst, a, bytes) || partial_overlap(dst, b, bytes)) {
    return fail(HMC_PROV_ERR_INVALID, "reduce: dst overlaps an input without being equal to it (dst %p, a %p, b %p)",
                dst, a, b);
  }
  PointerInfo di, ai, bi;
  if ((rc = check_reachable(dst, "reduce dst", &di)) != HMC_PROV_OK) return rc;
  if (a != dst && (rc = check_reachable(a, "reduce a", &ai)) != HMC_PROV_OK) return rc;
  if (b != dst && b != a && (rc = check_reachable(b, "reduce b", &bi)) != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  int device = 0;
  if ((rc = enter(s, stream, di, "reduce", &guard, &device)) != HMC_PROV_OK) return rc;
  const int max_blocks = s->devices[static_cast<size_t>(device)].sm_count * s->blocks_per_sm;
  cudaStream_t st = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamPerThread;
  return finish(kReduce[dtype](op, dst, a, b, count, max_blocks, st), stream, "reduce");
}

int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream) {
  auto* s = static_cast<State*>(state);
  size_t bytes = 0;
  int rc = check_buffer("divide", buf, count, dtype, &bytes);
  if (rc != HMC_PROV_OK) return rc;
  if (divisor == 0) return fail(HMC_PROV_ERR_INVALID, "divide: divisor is 0");
  if (count == 0 || divisor == 1) return HMC_PROV_OK;
  PointerInfo bi;
  if ((rc = check_reachable(buf, "divide", &bi)) != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  int device = 0;
  if ((rc = enter(s, stream, bi, "divide", &guard, &device)) != HMC_PROV_OK) return rc;
  const int max_blocks = s->devices[static_cast<size_t>(device)].sm_count * s->blocks_per_sm;
  cudaStream_t st = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamPerThread;
  return finish(kDivide[dtype](buf, count, divisor, max_blocks, st), stream, "divide");
}

}  // namespace hmc::cuda
