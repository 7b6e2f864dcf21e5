// State shared by the files of the cuda device provider, and its error, log and
// current-device helpers.
#pragma once

#include <cuda.h>  // driver-API types only: libcuda is reached through entry points
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "hmc/provider/device.h"

namespace hmc::cuda {

// Driver-API functions, resolved at init through cudaGetDriverEntryPointByVersion.
// The optional ones stay null when the driver lacks them.
struct Driver {
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range = nullptr;
  PFN_cuStreamWaitValue32_v11070 stream_wait_value32 = nullptr;             // optional
  PFN_cuMemGetHandleForAddressRange_v11070 mem_get_handle_for_range = nullptr;  // optional
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuPointerGetAttributes_v7000 pointer_get_attributes = nullptr;
};

struct Device {
  hmc_device_info_t info{};
  std::array<uint8_t, 16> uuid{};
  int sm_count = 1;
  bool kernels_loaded = false;  // load_kernels ran (guarded by State::mutex)
};

// A block handed out by mem_alloc.
struct Allocation {
  size_t bytes = 0;
  int kind = HMC_ALLOC_DEVICE;
  int device = 0;
};

// One opened IPC allocation of another process (or of this one), shared by every
// ipc_import of the same allocation; closed when the last of them is closed.
struct Import {
  void* base = nullptr;
  size_t bytes = 0;  // what the driver maps from base (cuMemGetAddressRange)
  int device = 0;
  int refs = 0;
  bool local = false;  // exported by this very process: nothing was opened
  // The exporter (pid, process nonce) and its base address: a second key for the same
  // allocation, should the driver hand out different handle bytes for it.
  int32_t pid = 0;
  uint64_t nonce = 0;
  uint64_t exporter_base = 0;
};

struct State {
  hmc_host_services_t host{};
  bool peer_access = true;  // HMC_CUDA_PEER_ACCESS
  int blocks_per_sm = 4;    // HMC_CUDA_REDUCE_BLOCKS
  void* libcuda = nullptr;  // our dlopen reference, dropped by fini
  Driver drv;
  std::vector<Device> devices;

  std::mutex mutex;  // guards everything below
  std::map<uintptr_t, Allocation> allocations;  // by base address
  std::map<std::string, Import> imports;        // by the 64 bytes of cudaIpcMemHandle_t
  std::multimap<uintptr_t, std::string> views;  // pointer ipc_import returned -> import key
  std::vector<std::vector<char>> peer_enabled;  // [device][peer]: enable attempted
  std::vector<void*> flag_chunks;               // pinned mapped host pages of flags
  std::vector<volatile uint32_t*> free_flags;
  std::set<uintptr_t> live_flags;
  std::map<uintptr_t, size_t> host_registered;  // host_register ranges: base -> bytes
};

// Loads every reduce and divide kernel into the current device's context, once per device.
// CUDA loads kernels on first launch (CUDA_MODULE_LOADING=LAZY, the default), and loading
// waits for the whole device: the first reduce while a stream waits on an HMC flag would
// never return, since the flag is set only when that reduce's collective ends.
int load_kernels(State* s, int device);

// Records a failure message for the calling thread (printf format) and returns `code`.
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Records "<what>: <call>: <cudaGetErrorString>" and returns the HMC code for `err`;
// also clears the runtime's last error so that it does not show up again later.
int fail_cuda(cudaError_t err, const char* what, const char* call);
// The same for a driver-API result.
int fail_cu(const State* s, CUresult res, const char* what, const char* call);
// The HMC code for a runtime error.
int code_of(cudaError_t err);
// The calling thread's last failure message ("" before the first failure).
const char* last_error_text();
// Logs through the host's callback. Formats only when the host gave one.
void log(const State* s, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// Makes `device` current for the scope and restores the caller's context after: the
// host never calls cudaSetDevice, and an application thread keeps its own. The driver's
// current context is what is put back, none included: cudaSetDevice of the device the
// runtime reports for a thread without one (0) would make a context on GPU 0 for a
// process that uses another, and would put the primary context in place of one of the
// application's own. (A thread left without a context has the runtime's device HMC set,
// which its own later runtime calls then use: docs/cuda.md.)
class DeviceGuard {
 public:
  DeviceGuard() = default;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // 0, or a negative code with last_error set (`what` names the entry point).
  int use(int device, const char* what);

 private:
  int previous_ = 0;
  CUcontext previous_ctx_ = nullptr;
  bool have_ctx_ = false;  // previous_ctx_ was read (the driver's entry points were found)
  bool changed_ = false;
};

// Where a pointer lives, from cudaPointerGetAttributes.
struct PointerInfo {
  cudaMemoryType type = cudaMemoryTypeUnregistered;  // Unregistered: pageable host memory
  int device = -1;
  bool on_device() const { return type == cudaMemoryTypeDevice || type == cudaMemoryTypeManaged; }
  bool host_visible() const { return type != cudaMemoryTypeDevice; }
};
int pointer_info(const void* p, const char* what, PointerInfo* out);

// The device a stream belongs to (an application's cudaStream_t included).
int stream_device(void* stream, const char* what, int* device);

// Checks 0 <= device < count.
int check_device(const State* s, int device, const char* what);

// Enables peer access from `device` to `peer` once, when allowed and possible.
void ensure_peer(State* s, int device, int peer);

// Entry points, one file each (memory: cuda_memory.cpp, IPC/dma-buf/flags:
// cuda_ipc.cpp, kernels: cuda_reduce.cu).
int mem_alloc(void* state, int device, size_t bytes, int kind, void** ptr);
int mem_free(void* state, int device, void* ptr);
int copy(void* state, void* dst, const void* src, size_t bytes, void* stream);
int host_register(void* state, void* ptr, size_t bytes);
int host_unregister(void* state, void* ptr);
int mem_query(void* state, const void* ptr, int* device, void** base, size_t* bytes, uint64_t* id);
void release_all(State* s);

int ipc_export(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
               size_t* handle_len);
int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr);
int ipc_close(void* state, void* ptr);
int ipc_extent(void* state, void* ptr, size_t* bytes);
int dmabuf_export(void* state, void* ptr, size_t bytes, int* fd, uint64_t* offset);
int flag_alloc(void* state, int device, volatile uint32_t** flag);
int flag_free(void* state, volatile uint32_t* flag);
int stream_wait_flag(void* state, void* stream, volatile uint32_t* flag, uint32_t value);
void release_ipc(State* s);

int reduce(void* state, void* dst, const void* a, const void* b, size_t count, int dtype, int op,
           void* stream);
int divide(void* state, void* buf, size_t count, int dtype, uint64_t divisor, void* stream);

}  // namespace hmc::cuda
