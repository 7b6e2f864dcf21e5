// hmc-cuda-waits: which CUDA runtime calls wait for all the device's queued work.
//
//   hmc-cuda-waits [--device N]
//
// A stream-ordered HMC operation leaves its stream waiting on a host flag that a host
// thread sets later (docs/architecture.md, Stream ordering). A call that waits for the whole
// device while that wait is queued returns only once the flag is set, and never if the
// thread that would set it is the one that made the call. Each row launches a kernel that
// spins on a mapped host flag, makes one call on this thread while the kernel spins, and
// sets the flag from another thread after kHoldSeconds: a call that took about that long
// waited for the device. Prints one row per call; exits non-zero only when CUDA fails.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace {

constexpr double kHoldSeconds = 1.0;
constexpr std::size_t kBytes = std::size_t{64} << 20;

__global__ void spin_until_set(volatile unsigned* flag) {
  while (*flag == 0) {
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "hmc-cuda-waits: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Runs `call` while a kernel spins on a host flag; false when CUDA failed.
bool probe(const char* name, const std::function<cudaError_t()>& call) {
  unsigned* flag = nullptr;
  unsigned* device_flag = nullptr;
  cudaStream_t spinning = nullptr;
  if (!ok(cudaHostAlloc(&flag, sizeof(unsigned), cudaHostAllocMapped), "cudaHostAlloc (flag)") ||
      !ok(cudaHostGetDevicePointer(&device_flag, flag, 0), "cudaHostGetDevicePointer") ||
      !ok(cudaStreamCreateWithFlags(&spinning, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"))
    return false;
  __atomic_store_n(flag, 0u, __ATOMIC_RELEASE);
  spin_until_set<<<1, 1, 0, spinning>>>(device_flag);
  if (!ok(cudaGetLastError(), "launch")) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the kernel is running
  const auto t0 = std::chrono::steady_clock::now();
  std::thread setter([flag] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kHoldSeconds));
    __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
  });
  const cudaError_t err = call();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  setter.join();
  const bool synced = ok(cudaStreamSynchronize(spinning), "cudaStreamSynchronize");
  std::printf("%-44s %7.3f s  %-22s %s\n", name, took, cudaGetErrorString(err),
              took > 0.75 * kHoldSeconds ? "WAITS for the device" : "does not wait");
  cudaStreamDestroy(spinning);
  cudaFreeHost(flag);
  return synced && err == cudaSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: hmc-cuda-waits [--device N]\n");
      return 2;
    }
  }
  if (!ok(cudaSetDevice(device), "cudaSetDevice") || !ok(cudaFree(nullptr), "context")) return 1;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  std::printf("device %d: %s, driver %d, runtime %d; a kernel spins for %.1f s during each call\n", device,
              prop.name, driver, runtime, kHoldSeconds);
  // Made before the probes, so that each probe makes only the call it names.
  std::vector<void*> host(3), dev(2);
  for (void*& h : host) h = std::aligned_alloc(4096, kBytes);
  void* pinned = nullptr;
  cudaStream_t other = nullptr;
  cudaEvent_t event = nullptr;
  if (!ok(cudaMalloc(&dev[0], kBytes), "cudaMalloc") || !ok(cudaHostAlloc(&pinned, kBytes, 0), "cudaHostAlloc") ||
      !ok(cudaHostRegister(host[1], kBytes, cudaHostRegisterPortable), "cudaHostRegister") ||
      !ok(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") ||
      !ok(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"))
    return 1;
  bool all = true;
  all &= probe("cudaMalloc (64 MiB)", [&] { return cudaMalloc(&dev[1], kBytes); });
  all &= probe("cudaFree (64 MiB)", [&] { return cudaFree(dev[0]); });
  all &= probe("cudaHostRegister (64 MiB)", [&] { return cudaHostRegister(host[0], kBytes, cudaHostRegisterPortable); });
  all &= probe("cudaHostUnregister (64 MiB)", [&] { return cudaHostUnregister(host[1]); });
  all &= probe("cudaFreeHost (64 MiB)", [&] { return cudaFreeHost(pinned); });
  all &= probe("cudaMemcpyAsync H2D + sync, another stream", [&] {
    cudaError_t e = cudaMemcpyAsync(dev[1], host[2], kBytes, cudaMemcpyHostToDevice, other);
    return e == cudaSuccess ? cudaStreamSynchronize(other) : e;
  });
  all &= probe("cudaEventRecord + sync, another stream", [&] {
    cudaError_t e = cudaEventRecord(event, other);
    return e == cudaSuccess ? cudaEventSynchronize(event) : e;
  });
  all &= probe("cudaStreamDestroy (another stream)", [&] { return cudaStreamDestroy(other); });
  cudaHostUnregister(host[0]);
  cudaFree(dev[1]);
  cudaEventDestroy(event);
  for (void* h : host) std::free(h);
  return all ? 0 : 1;
}
