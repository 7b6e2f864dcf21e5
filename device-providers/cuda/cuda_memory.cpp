// Memory of the cuda provider: allocation and copies between any two pointers.
#include <cstring>
#include <iterator>

#include "cuda_state.h"

namespace hmc::cuda {

int mem_alloc(void* state, int device, size_t bytes, int kind, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: null output pointer");
  *ptr = nullptr;
  if (const int rc = check_device(s, device, "mem_alloc"); rc != HMC_PROV_OK) return rc;
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: 0 bytes");
  if (kind != HMC_ALLOC_DEVICE && kind != HMC_ALLOC_PINNED_HOST && kind != HMC_ALLOC_SHAREABLE) {
    return fail(HMC_PROV_ERR_INVALID, "mem_alloc: unknown kind %d", kind);
  }
  DeviceGuard guard;
  if (const int rc = guard.use(device, "mem_alloc"); rc != HMC_PROV_OK) return rc;
  void* p = nullptr;
  if (kind == HMC_ALLOC_PINNED_HOST) {
    // Portable: every device sees it pinned; mapped: kernels and stream memory
    // operations can reach it (UVA: the device address is the host address).
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) return fail_cuda(err, "mem_alloc", "cudaHostAlloc");
  } else {
    // Plain cudaMalloc memory for both kinds: it is what cudaIpcGetMemHandle exports,
    // so every device block (and an application's own) can be shared.
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) return fail_cuda(err, "mem_alloc", "cudaMalloc");
  }
  {
    std::lock_guard lock(s->mutex);
    s->allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, kind, device};
  }
  *ptr = p;
  return HMC_PROV_OK;
}

namespace {

cudaError_t free_block(void* p, const Allocation& a) {
  DeviceGuard guard;
  if (guard.use(a.device, "mem_free") != HMC_PROV_OK) return cudaErrorInvalidDevice;
  return a.kind == HMC_ALLOC_PINNED_HOST ? cudaFreeHost(p) : cudaFree(p);
}

}  // namespace

int mem_free(void* state, int device, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "mem_free: null pointer");
  Allocation a;
  {
    std::lock_guard lock(s->mutex);
    const auto it = s->allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s->allocations.end()) {
      return fail(HMC_PROV_ERR_INVALID, "mem_free: %p is not a block from mem_alloc", ptr);
    }
    a = it->second;
    s->allocations.erase(it);
  }
  const cudaError_t err = free_block(ptr, a);
  return err == cudaSuccess ? HMC_PROV_OK
                            : fail_cuda(err, "mem_free", a.kind == HMC_ALLOC_PINNED_HOST ? "cudaFreeHost" : "cudaFree");
}

// Page-locks ordinary host memory so that copies to and from it run at pinned speed
// (a pageable copy goes through the driver's own bounce buffers at about half of it).
// Portable: every device of this process sees it registered.
int host_register(void* state, void* ptr, size_t bytes) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr || bytes == 0) {
    return fail(HMC_PROV_ERR_INVALID, "host_register: %s", ptr == nullptr ? "null pointer" : "0 bytes");
  }
  const auto key = reinterpret_cast<uintptr_t>(ptr);
  {
    std::lock_guard lock(s->mutex);
    auto next = s->host_registered.lower_bound(key);
    const bool overlaps_next = next != s->host_registered.end() && next->first < key + bytes;
    const bool overlaps_prev = next != s->host_registered.begin() && std::prev(next)->first + std::prev(next)->second > key;
    if (overlaps_next || overlaps_prev) {
      return fail(HMC_PROV_ERR_INVALID, "host_register: [%p, +%zu) overlaps a range already registered", ptr, bytes);
    }
  }
  const cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) return fail_cuda(err, "host_register", "cudaHostRegister");
  std::lock_guard lock(s->mutex);
  s->host_registered[key] = bytes;
  return HMC_PROV_OK;
}

int host_unregister(void* state, void* ptr) {
  auto* s = static_cast<State*>(state);
  {
    std::lock_guard lock(s->mutex);
    if (s->host_registered.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      return fail(HMC_PROV_ERR_INVALID, "host_unregister: %p was not registered with host_register", ptr);
    }
  }
  const cudaError_t err = cudaHostUnregister(ptr);
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "host_unregister", "cudaHostUnregister");
}

void release_all(State* s) {
  std::map<uintptr_t, Allocation> left;
  std::map<uintptr_t, size_t> registered;
  {
    std::lock_guard lock(s->mutex);
    left.swap(s->allocations);
    registered.swap(s->host_registered);
  }
  for (const auto& [addr, a] : left) {
    if (free_block(reinterpret_cast<void*>(addr), a) != cudaSuccess) cudaGetLastError();
  }
  for (const auto& [addr, bytes] : registered) {
    if (cudaHostUnregister(reinterpret_cast<void*>(addr)) != cudaSuccess) cudaGetLastError();
  }
  if (!left.empty()) log(s, HMC_LOG_WARN, "fini: freed %zu blocks the host had not freed", left.size());
  if (!registered.empty()) {
    log(s, HMC_LOG_WARN, "fini: unregistered %zu host ranges the host had left registered", registered.size());
  }
}

// Copies under UVA with cudaMemcpyDefault: the driver finds the direction. The device
// doing the copy is the stream's, else the one that owns dst, else src's.
int copy(void* state, void* dst, const void* src, size_t bytes, void* stream) {
  auto* s = static_cast<State*>(state);
  if (bytes == 0) return HMC_PROV_OK;
  if (dst == nullptr || src == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "copy: null %s with %zu bytes", dst == nullptr ? "dst" : "src", bytes);
  }
  PointerInfo di, si;
  if (const int rc = pointer_info(dst, "copy dst", &di); rc != HMC_PROV_OK) return rc;
  if (const int rc = pointer_info(src, "copy src", &si); rc != HMC_PROV_OK) return rc;
  int device = 0;
  if (stream != nullptr) {
    if (const int rc = stream_device(stream, "copy", &device); rc != HMC_PROV_OK) return rc;
  } else if (di.host_visible() && si.host_visible() && di.type != cudaMemoryTypeManaged &&
             si.type != cudaMemoryTypeManaged) {
    std::memcpy(dst, src, bytes);  // host to host, synchronous: the CPU does it
    return HMC_PROV_OK;
  } else {
    device = di.on_device() ? di.device : si.device;
  }
  if (di.on_device() && si.on_device() && di.device != si.device) {
    ensure_peer(s, device, device == di.device ? si.device : di.device);
  }
  DeviceGuard guard;
  if (const int rc = guard.use(device, "copy"); rc != HMC_PROV_OK) return rc;
  cudaStream_t st = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamPerThread;
  cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st);
  if (err != cudaSuccess) return fail_cuda(err, "copy", "cudaMemcpyAsync");
  if (stream == nullptr) {
    err = cudaStreamSynchronize(st);
    if (err != cudaSuccess) return fail_cuda(err, "copy", "cudaStreamSynchronize");
  }
  return HMC_PROV_OK;
}

}  // namespace hmc::cuda
