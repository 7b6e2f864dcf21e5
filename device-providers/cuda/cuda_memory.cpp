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

// Memory the host did not allocate: an application's cudaMalloc, a framework's pool.
// cuPointerGetAttributes, which needs no current context and creates none (the runtime's
// cudaPointerGetAttributes may initialise a primary context). The plural query answers
// CUDA_SUCCESS for an address CUDA does not know, leaving every attribute zero: memory
// type 0, so such an address is "not device memory". Managed memory reports the device
// type too; the CPU reaches it, so it is not ours to move. Driver ordinals are the
// runtime's, which number this provider's devices. The range is the allocation's
// (cuMemGetAddressRange's, which would need a context); for cuMem* memory it is the
// whole cuMemAddressReserve reservation, mapped or not.
int mem_query(void* state, const void* ptr, int* device, void** base, size_t* bytes, uint64_t* id) {
  const auto* s = static_cast<const State*>(state);
  if (device == nullptr || base == nullptr || bytes == nullptr || id == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "mem_query: null output pointer");
  }
  if (ptr == nullptr) return 1;
  const auto at = reinterpret_cast<CUdeviceptr>(ptr);
  // Most asks are about host memory: the type alone first, which costs half as much as
  // asking for all five attributes (34 against 74 ns on an H200 host without a context,
  // 94-108 against 140-151 with one).
  unsigned int type = 0;
  uint32_t managed = 0;
  CUpointer_attribute kind[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* kind_data[] = {&type, &managed};
  CUresult res = s->drv.pointer_get_attributes(2, kind, kind_data, at);
  if (res != CUDA_SUCCESS) return fail_cu(s, res, "mem_query", "cuPointerGetAttributes");
  if (type != CU_MEMORYTYPE_DEVICE || managed != 0) return 1;
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long buffer_id = 0;  // unique in the process, never reused
  CUpointer_attribute where[] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void* where_data[] = {&ordinal, &start, &size, &buffer_id};
  res = s->drv.pointer_get_attributes(4, where, where_data, at);
  if (res != CUDA_SUCCESS) return fail_cu(s, res, "mem_query", "cuPointerGetAttributes");
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= s->devices.size() || size == 0) {
    return fail(HMC_PROV_ERR_INTERNAL,
                "mem_query: the driver places %p on device %d in [0x%llx, +%zu), which this process "
                "cannot use (it sees %zu devices)",
                ptr, ordinal, static_cast<unsigned long long>(start), size, s->devices.size());
  }
  *device = ordinal;
  *base = reinterpret_cast<void*>(start);
  *bytes = size;
  *id = buffer_id;
  return HMC_PROV_OK;
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
