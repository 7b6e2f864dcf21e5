// IPC (cudaIpc handles), dma-buf export and stream flags of the cuda provider.
//
// IPC handle (opaque to the host, at most HMC_IPC_HANDLE_MAX bytes): a magic and
// version, the exporter's pid and a random number of the exporting process, the UUID of the exporting GPU, the cudaIpcMemHandle_t
// of the whole allocation, the allocation's base address and size in the exporter,
// the offset of the exported pointer inside it and the exported length, and a check
// word over all of it. The importer opens the allocation once per process, on the
// GPU with the same UUID when it sees one (else device 0, with peer access), counts
// the imports of it (cudaIpcOpenMemHandle refuses a second open of one allocation)
// and hands out base + offset; ipc_close drops one import and closes the mapping
// with the last. A handle imported by its own exporting process maps nothing: the
// exporter's address is valid there.
#include <cstring>
#include <random>
#include <string>

#include <unistd.h>

#include "cuda_state.h"

namespace hmc::cuda {
namespace {

constexpr uint64_t kIpcMagic = 0x3143504941445543ull;  // "CUDAIPC1"
constexpr uint32_t kIpcVersion = 1;

struct IpcHandle {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  uint64_t nonce;       // random per exporting process: pid alone repeats across pid namespaces
  uint8_t uuid[16];
  cudaIpcMemHandle_t mem;
  uint64_t base;        // allocation base in the exporter
  uint64_t alloc_bytes;
  uint64_t offset;      // of the exported pointer inside the allocation
  uint64_t bytes;
  uint64_t check;
};
static_assert(sizeof(IpcHandle) <= HMC_IPC_HANDLE_MAX);

// A random number fixed for the life of this process (and of the plugin, which is
// never unloaded): tells an import of our own export from another process's.
uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return nonce;
}

uint64_t check_word(const IpcHandle& h) {
  uint64_t x = 0xcbf29ce484222325ull;  // FNV-1a over everything before `check`
  const auto* p = reinterpret_cast<const uint8_t*>(&h);
  for (size_t i = 0; i < offsetof(IpcHandle, check); ++i) x = (x ^ p[i]) * 0x100000001b3ull;
  return x;
}

// Base and size of the allocation holding `ptr`, through the driver.
int address_range(const State* s, const void* ptr, const char* what, uintptr_t* base, size_t* size) {
  // The driver looks the range up in the current context: make it the pointer's device's
  // (a process using GPU 1 may still have GPU 0 current).
  PointerInfo pi;
  DeviceGuard guard;
  if (pointer_info(ptr, what, &pi) == HMC_PROV_OK && pi.device >= 0)
    if (const int rc = guard.use(pi.device, what); rc != HMC_PROV_OK) return rc;
  CUdeviceptr b = 0;
  size_t n = 0;
  const CUresult res = s->drv.mem_get_address_range(&b, &n, reinterpret_cast<CUdeviceptr>(ptr));
  if (res != CUDA_SUCCESS) return fail_cu(s, res, what, "cuMemGetAddressRange");
  *base = static_cast<uintptr_t>(b);
  *size = n;
  return HMC_PROV_OK;
}

std::string key_of(const cudaIpcMemHandle_t& h) {
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

size_t page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<size_t>(p) : size_t{4096};
}

}  // namespace

int ipc_export(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
               size_t* handle_len) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr || handle == nullptr || handle_len == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: null pointer argument");
  }
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "ipc_export: 0 bytes");
  if (handle_cap < sizeof(IpcHandle)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: handle buffer of %zu bytes, need %zu", handle_cap,
                sizeof(IpcHandle));
  }
  PointerInfo pi;
  if (const int rc = pointer_info(ptr, "ipc_export", &pi); rc != HMC_PROV_OK) return rc;
  if (pi.type != cudaMemoryTypeDevice) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: %p is not device memory (cudaMalloc or mem_alloc)", ptr);
  }
  if (const int rc = check_device(s, pi.device, "ipc_export"); rc != HMC_PROV_OK) return rc;
  uintptr_t base = 0;
  size_t size = 0;
  if (const int rc = address_range(s, ptr, "ipc_export", &base, &size); rc != HMC_PROV_OK) return rc;
  const uintptr_t offset = reinterpret_cast<uintptr_t>(ptr) - base;
  if (bytes > size - offset) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: [%p, +%zu) runs past its allocation (%zu bytes at 0x%lx)",
                ptr, bytes, size, static_cast<unsigned long>(base));
  }
  IpcHandle h{};
  h.magic = kIpcMagic;
  h.version = kIpcVersion;
  h.pid = static_cast<int32_t>(getpid());
  h.nonce = process_nonce();
  std::memcpy(h.uuid, s->devices[static_cast<size_t>(pi.device)].uuid.data(), sizeof(h.uuid));
  DeviceGuard guard;
  if (const int rc = guard.use(pi.device, "ipc_export"); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaIpcGetMemHandle(&h.mem, reinterpret_cast<void*>(base));
  if (err != cudaSuccess) return fail_cuda(err, "ipc_export", "cudaIpcGetMemHandle");
  h.base = base;
  h.alloc_bytes = size;
  h.offset = offset;
  h.bytes = bytes;
  h.check = check_word(h);
  std::memcpy(handle, &h, sizeof(h));
  *handle_len = sizeof(h);
  return HMC_PROV_OK;
}

int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (handle == nullptr || ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "ipc_import: null pointer argument");
  *ptr = nullptr;
  if (handle_len != sizeof(IpcHandle)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle of %zu bytes, a cuda handle has %zu", handle_len,
                sizeof(IpcHandle));
  }
  IpcHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kIpcMagic || h.version != kIpcVersion || h.check != check_word(h)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: not a cuda IPC handle (bad magic, version or check word)");
  }
  if (h.offset > h.alloc_bytes || h.bytes > h.alloc_bytes - h.offset) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle range outside its allocation");
  }
  const std::string key = key_of(h.mem);
  std::lock_guard lock(s->mutex);
  // Keyed by the CUDA handle alone: an allocation freed and made again at the same address
  // has a new handle, and must not reuse the old mapping.
  auto it = s->imports.find(key);
  if (it == s->imports.end()) {
    Import imp;
    imp.pid = h.pid;
    imp.nonce = h.nonce;
    imp.exporter_base = h.base;
    if (h.pid == static_cast<int32_t>(getpid()) && h.nonce == process_nonce()) {
      // Our own export: the address is valid here; check that it still is that allocation.
      uintptr_t base = 0;
      size_t size = 0;
      if (const int rc = address_range(s, reinterpret_cast<void*>(h.base), "ipc_import", &base, &size);
          rc != HMC_PROV_OK) {
        return rc;
      }
      if (base != h.base || size != h.alloc_bytes) {
        return fail(HMC_PROV_ERR_INVALID, "ipc_import: this process exported the handle, and freed the memory since");
      }
      PointerInfo pi;
      if (const int rc = pointer_info(reinterpret_cast<void*>(base), "ipc_import", &pi); rc != HMC_PROV_OK) return rc;
      imp.base = reinterpret_cast<void*>(base);
      imp.bytes = size;
      imp.device = pi.device;
      imp.local = true;
    } else {
      int device = 0;  // the exporter's GPU when this process sees it, else device 0 via peer access
      for (size_t d = 0; d < s->devices.size(); ++d) {
        if (std::memcmp(s->devices[d].uuid.data(), h.uuid, sizeof(h.uuid)) == 0) device = static_cast<int>(d);
      }
      DeviceGuard guard;
      if (const int rc = guard.use(device, "ipc_import"); rc != HMC_PROV_OK) return rc;
      const cudaError_t err = cudaIpcOpenMemHandle(&imp.base, h.mem, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) {
        // What this process holds of the same exporter, for the message: the driver refuses
        // a handle whose memory it has mapped here already (cudaErrorAlreadyMapped).
        size_t same = 0, same_base = 0;
        for (const auto& [k, other] : s->imports) {
          if (other.pid != h.pid || other.nonce != h.nonce) continue;
          ++same;
          if (other.exporter_base == h.base) ++same_base;
        }
        fail_cuda(err, "ipc_import", "cudaIpcOpenMemHandle");
        const std::string first = last_error_text();
        return fail(code_of(err), "%s (exporter pid %d, its allocation 0x%llx of %llu bytes on device %d here; this "
                    "process holds %zu imports of that exporter, %zu at the same address)", first.c_str(),
                    static_cast<int>(h.pid), static_cast<unsigned long long>(h.base),
                    static_cast<unsigned long long>(h.alloc_bytes), device, same, same_base);
      }
      imp.device = device;
      // What the driver mapped, which bounds every view of it (ipc_extent): the handle's
      // sizes come from the exporter.
      uintptr_t mapped = 0;
      if (const int rc = address_range(s, imp.base, "ipc_import", &mapped, &imp.bytes); rc != HMC_PROV_OK) {
        cudaIpcCloseMemHandle(imp.base);
        return rc;
      }
    }
    it = s->imports.emplace(key, imp).first;
  }
  if (const size_t mapped = it->second.bytes; h.alloc_bytes > mapped) {
    if (it->second.refs == 0) {  // made just now for this handle: undone
      if (!it->second.local) cudaIpcCloseMemHandle(it->second.base);
      s->imports.erase(it);
    }
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: the handle says its allocation has %llu bytes, the driver maps %zu",
                static_cast<unsigned long long>(h.alloc_bytes), mapped);
  }
  ++it->second.refs;
  void* p = static_cast<char*>(it->second.base) + h.offset;
  s->views.emplace(reinterpret_cast<uintptr_t>(p), it->first);
  *ptr = p;
  return HMC_PROV_OK;
}

int ipc_extent(void* state, void* ptr, size_t* bytes) {
  auto* s = static_cast<State*>(state);
  if (bytes == nullptr) return fail(HMC_PROV_ERR_INVALID, "ipc_extent: null output pointer");
  std::lock_guard lock(s->mutex);
  const auto v = s->views.find(reinterpret_cast<uintptr_t>(ptr));
  const auto it = v == s->views.end() ? s->imports.end() : s->imports.find(v->second);
  if (it == s->imports.end()) return fail(HMC_PROV_ERR_INVALID, "ipc_extent: %p was not returned by ipc_import", ptr);
  const uintptr_t end = reinterpret_cast<uintptr_t>(it->second.base) + it->second.bytes;
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  *bytes = at < end ? end - at : 0;
  return HMC_PROV_OK;
}

int ipc_close(void* state, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "ipc_close: null pointer");
  Import closing;
  {
    std::lock_guard lock(s->mutex);
    const auto v = s->views.find(reinterpret_cast<uintptr_t>(ptr));
    if (v == s->views.end()) return fail(HMC_PROV_ERR_INVALID, "ipc_close: %p is not from ipc_import", ptr);
    const auto it = s->imports.find(v->second);
    s->views.erase(v);
    if (it == s->imports.end() || --it->second.refs > 0) return HMC_PROV_OK;
    closing = it->second;
    s->imports.erase(it);
  }
  if (closing.local) return HMC_PROV_OK;
  DeviceGuard guard;
  if (const int rc = guard.use(closing.device, "ipc_close"); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaIpcCloseMemHandle(closing.base);
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "ipc_close", "cudaIpcCloseMemHandle");
}

void release_ipc(State* s) {
  std::map<std::string, Import> imports;
  std::vector<void*> chunks;
  {
    std::lock_guard lock(s->mutex);
    imports.swap(s->imports);
    s->views.clear();
    chunks.swap(s->flag_chunks);
    s->free_flags.clear();
    s->live_flags.clear();
  }
  for (const auto& [key, imp] : imports) {
    if (imp.local) continue;
    DeviceGuard guard;
    if (guard.use(imp.device, "fini") == HMC_PROV_OK && cudaIpcCloseMemHandle(imp.base) != cudaSuccess) {
      cudaGetLastError();
    }
  }
  for (void* c : chunks) {
    if (cudaFreeHost(c) != cudaSuccess) cudaGetLastError();
  }
  if (!imports.empty()) log(s, HMC_LOG_WARN, "fini: closed %zu IPC imports the host had not closed", imports.size());
}

// A dma-buf of whole pages around [ptr, ptr + bytes): `offset` is where ptr lies in it.
int dmabuf_export(void* state, void* ptr, size_t bytes, int* fd, uint64_t* offset) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr || fd == nullptr || offset == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "dmabuf_export: null pointer argument");
  }
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "dmabuf_export: 0 bytes");
  if (s->drv.mem_get_handle_for_range == nullptr) {
    return fail(HMC_PROV_ERR_UNSUPPORTED, "dmabuf_export: the driver has no cuMemGetHandleForAddressRange");
  }
  PointerInfo pi;
  if (const int rc = pointer_info(ptr, "dmabuf_export", &pi); rc != HMC_PROV_OK) return rc;
  if (pi.type != cudaMemoryTypeDevice) {
    return fail(HMC_PROV_ERR_INVALID, "dmabuf_export: %p is not device memory", ptr);
  }
  if (const int rc = check_device(s, pi.device, "dmabuf_export"); rc != HMC_PROV_OK) return rc;
  int supported = 0;
  const CUresult ares = s->drv.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, pi.device);
  if (ares != CUDA_SUCCESS) return fail_cu(s, ares, "dmabuf_export", "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)");
  if (supported == 0) {
    return fail(HMC_PROV_ERR_UNSUPPORTED,
                "dmabuf_export: device %d does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; "
                "it needs the open kernel modules and a kernel with dma-buf)", pi.device);
  }
  uintptr_t base = 0;
  size_t size = 0;
  if (const int rc = address_range(s, ptr, "dmabuf_export", &base, &size); rc != HMC_PROV_OK) return rc;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (bytes > base + size - p) {
    return fail(HMC_PROV_ERR_INVALID, "dmabuf_export: [%p, +%zu) runs past its allocation", ptr, bytes);
  }
  const size_t page = page_size();
  const uintptr_t start = p / page * page;
  const uintptr_t end = (p + bytes + page - 1) / page * page;
  if (start < base || end > base + size) {
    return fail(HMC_PROV_ERR_INVALID,
                "dmabuf_export: the pages around [%p, +%zu) reach outside its allocation (0x%lx, %zu bytes)", ptr,
                bytes, static_cast<unsigned long>(base), size);
  }
  DeviceGuard guard;
  if (const int rc = guard.use(pi.device, "dmabuf_export"); rc != HMC_PROV_OK) return rc;
  int out = -1;
  const CUresult res = s->drv.mem_get_handle_for_range(&out, static_cast<CUdeviceptr>(start), end - start,
                                                       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (res != CUDA_SUCCESS) return fail_cu(s, res, "dmabuf_export", "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
  *fd = out;
  *offset = p - start;
  return HMC_PROV_OK;
}

// ---- stream flags: 32-bit words in pinned, device-mapped host memory ---------------

namespace {
constexpr size_t kFlagChunk = 4096;
constexpr size_t kFlagStride = 64;  // one cache line per flag
}  // namespace

int flag_alloc(void* state, int device, volatile uint32_t** flag) {
  auto* s = static_cast<State*>(state);
  if (flag == nullptr) return fail(HMC_PROV_ERR_INVALID, "flag_alloc: null output pointer");
  *flag = nullptr;
  if (const int rc = check_device(s, device, "flag_alloc"); rc != HMC_PROV_OK) return rc;
  if (s->drv.stream_wait_value32 == nullptr) {
    return fail(HMC_PROV_ERR_UNSUPPORTED, "flag_alloc: the driver has no cuStreamWaitValue32");
  }
  std::lock_guard lock(s->mutex);
  if (s->free_flags.empty()) {
    DeviceGuard guard;
    if (const int rc = guard.use(device, "flag_alloc"); rc != HMC_PROV_OK) return rc;
    void* chunk = nullptr;
    const cudaError_t err = cudaHostAlloc(&chunk, kFlagChunk, cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) return fail_cuda(err, "flag_alloc", "cudaHostAlloc");
    s->flag_chunks.push_back(chunk);
    for (size_t off = kFlagChunk; off >= kFlagStride; off -= kFlagStride) {
      s->free_flags.push_back(reinterpret_cast<volatile uint32_t*>(static_cast<char*>(chunk) + off - kFlagStride));
    }
  }
  volatile uint32_t* f = s->free_flags.back();
  s->free_flags.pop_back();
  s->live_flags.insert(reinterpret_cast<uintptr_t>(f));
  *f = 0;
  *flag = f;
  return HMC_PROV_OK;
}

int flag_free(void* state, volatile uint32_t* flag) {
  auto* s = static_cast<State*>(state);
  std::lock_guard lock(s->mutex);
  if (flag == nullptr || s->live_flags.erase(reinterpret_cast<uintptr_t>(flag)) == 0) {
    return fail(HMC_PROV_ERR_INVALID, "flag_free: %p is not a flag from flag_alloc", static_cast<volatile void*>(flag));
  }
  s->free_flags.push_back(flag);
  return HMC_PROV_OK;
}

int stream_wait_flag(void* state, void* stream, volatile uint32_t* flag, uint32_t value) {
  auto* s = static_cast<State*>(state);
  if (stream == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "stream_wait_flag: needs a stream (the NULL stream would block the caller)");
  }
  {
    std::lock_guard lock(s->mutex);
    if (flag == nullptr || s->live_flags.count(reinterpret_cast<uintptr_t>(flag)) == 0) {
      return fail(HMC_PROV_ERR_INVALID, "stream_wait_flag: %p is not a flag from flag_alloc",
                  static_cast<volatile void*>(flag));
    }
  }
  if (s->drv.stream_wait_value32 == nullptr) {
    return fail(HMC_PROV_ERR_UNSUPPORTED, "stream_wait_flag: the driver has no cuStreamWaitValue32");
  }
  int device = 0;
  if (const int rc = stream_device(stream, "stream_wait_flag", &device); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(device, "stream_wait_flag"); rc != HMC_PROV_OK) return rc;
  // Nothing the operation does behind this wait may need the whole device.
  if (const int rc = load_kernels(s, device); rc != HMC_PROV_OK) return rc;
  void* dptr = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&dptr, const_cast<uint32_t*>(flag), 0);
  if (err != cudaSuccess) return fail_cuda(err, "stream_wait_flag", "cudaHostGetDevicePointer");
  const CUresult res = s->drv.stream_wait_value32(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(dptr),
                                                  value, CU_STREAM_WAIT_VALUE_GEQ);
  if (res == CUDA_ERROR_NOT_SUPPORTED) {
    return fail(HMC_PROV_ERR_UNSUPPORTED,
                "stream_wait_flag: device %d has no stream memory operations (cuStreamWaitValue32: not supported)",
                device);
  }
  return res == CUDA_SUCCESS ? HMC_PROV_OK : fail_cu(s, res, "stream_wait_flag", "cuStreamWaitValue32");
}

}  // namespace hmc::cuda
