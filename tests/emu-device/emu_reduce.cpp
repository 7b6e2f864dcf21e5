// Reduce and divide of the emulated device: the cpu provider's kernels (linked from
// hmc-device-cpu-reduce, so the results are the cpu provider's bit for bit) applied to
// the shadows of device memory, on the caller or on a stream.
#include <cstdarg>

#include "cpu_reduce.h"
#include "emu_ops.h"
#include "emu_stream.h"

// The cpu kernels report bad arguments through hmc::cpu::fail: into our error buffer.
namespace hmc::cpu {
int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const int rc = hmc::emu::vfail(code, fmt, args);
  va_end(args);
  return rc;
}
}  // namespace hmc::cpu

namespace hmc::emu {
namespace {

constexpr size_t kDtypeSize[HMC_DTYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};

// Checked here, before anything is queued, so that a bad call fails on the caller's
// thread; what only the kernel checks (alignment, overlap) fails the stream instead.
int buffer_bytes(const char* what, int dtype, size_t count, size_t* bytes) {
  if (dtype < 0 || dtype >= HMC_DTYPE_COUNT) {
    return fail(HMC_PROV_ERR_INVALID, "%s: unknown dtype %d", what, dtype);
  }
  if (count > SIZE_MAX / kDtypeSize[dtype]) {
    return fail(HMC_PROV_ERR_INVALID, "%s: count %zu overflows the address space", what, count);
  }
  *bytes = count * kDtypeSize[dtype];
  return HMC_PROV_OK;
}

int view_of(State* s, const char* what, const void* p, size_t bytes, View* v) {
  if (p == nullptr) return fail(HMC_PROV_ERR_INVALID, "%s: null buffer with %zu bytes", what, bytes);
  return translate(s, what, p, bytes, v);
}

}  // namespace

int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream) {
  auto* s = static_cast<State*>(state);
  if (op < 0 || op >= HMC_OP_COUNT) return fail(HMC_PROV_ERR_INVALID, "reduce: unknown op %d", op);
  size_t bytes = 0;
  int rc = buffer_bytes("reduce", dtype, count, &bytes);
  if (rc != HMC_PROV_OK) return rc;
  if (count == 0) return stream == nullptr ? HMC_PROV_OK : submit(s, "reduce", stream, Op{});
  View d, x, y;
  rc = view_of(s, "reduce dst", dst, bytes, &d);
  if (rc == HMC_PROV_OK) rc = view_of(s, "reduce a", a, bytes, &x);
  if (rc == HMC_PROV_OK) rc = view_of(s, "reduce b", b, bytes, &y);
  if (rc != HMC_PROV_OK) return rc;
  Op work;
  work.run = [s, d, x, y, count, dtype, op] {
    return hmc::cpu::reduce(&s->cpu, d.host, x.host, y.host, count, dtype, op, nullptr);
  };
  return submit(s, "reduce", stream, std::move(work), queue_device(s, {dst, a, b}));
}

int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream) {
  auto* s = static_cast<State*>(state);
  size_t bytes = 0;
  int rc = buffer_bytes("divide", dtype, count, &bytes);
  if (rc != HMC_PROV_OK) return rc;
  if (divisor == 0) return fail(HMC_PROV_ERR_INVALID, "divide: divisor is 0");
  if (count == 0) return stream == nullptr ? HMC_PROV_OK : submit(s, "divide", stream, Op{});
  View v;
  rc = view_of(s, "divide", buf, bytes, &v);
  if (rc != HMC_PROV_OK) return rc;
  Op work;
  work.run = [s, v, count, dtype, divisor] {
    return hmc::cpu::divide(&s->cpu, v.host, count, dtype, divisor, nullptr);
  };
  return submit(s, "divide", stream, std::move(work), queue_device(s, {buf}));
}

}  // namespace hmc::emu
