// Helpers of the device test suite: which device provider is under test, device buffers
// filled and read back through Context::copy (a test never touches device memory), and
// the device's streams (hmc::Stream) for stream-ordering tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "hmc/hmc.h"
#include "multiprocess.h"

namespace hmc::test {

// The provider under test (HMCTEST_DEVICE), e.g. "emu" or "cuda".
std::string device_under_test();
// Empty when it is available here, else why not.
std::string device_unavailable_reason();
// The device rank `rank` uses: index rank % device count.
DeviceId device_for(Context& ctx, int rank);

// A buffer on a device (or on the host for DeviceId{"cpu", 0}) with a host mirror.
struct DevBuf {
  Context* ctx = nullptr;
  Memory mem;
  std::vector<uint8_t> host;
  std::unique_ptr<void, void (*)(void*)> plain{nullptr, &std::free};  // host memory HMC did not allocate
  std::shared_ptr<void> foreign;  // device memory HMC did not allocate

  static Result<DevBuf> make(Context& ctx, const DeviceId& dev, std::size_t bytes, AllocKind kind = AllocKind::kDefault);
  // Device memory as the application's own runtime allocates it (cudaMalloc, say), which
  // HMC learns of only by asking the provider (HMC_DEV_CAP_MEM_QUERY): a second instance
  // of the provider, loaded from the same file, allocates it.
  static Result<DevBuf> make_foreign(Context& ctx, const DeviceId& dev, std::size_t bytes);
  void* ptr() { return mem.data() ? mem.data() : plain ? plain.get() : foreign.get(); }
  Status push();  // host mirror -> buffer
  Status pull();  // buffer -> host mirror
};

}  // namespace hmc::test
