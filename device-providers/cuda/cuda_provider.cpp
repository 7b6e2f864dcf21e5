// HMC device provider "cuda": NVIDIA GPUs through the CUDA runtime.
//
// Hardware: NVIDIA GPUs the installed driver supports; built with CUDA 13 for sm_90
// with compute_90 PTX (other GPUs JIT-compile it). The runtime is linked statically
// and libcuda.so.1 is opened at init, never linked: without a driver or a GPU, init
// answers HMC_PROV_ERR_UNAVAILABLE ("no CUDA driver: ..." / "no CUDA device: ...").
// Driver-API calls (cuMemGetAddressRange, cuStreamWaitValue32,
// cuMemGetHandleForAddressRange, cuDeviceGetAttribute, cuPointerGetAttributes) come
// from cudaGetDriverEntryPointByVersion.
// Capabilities: DEVICE_MEM, PINNED_HOST, SHAREABLE, STREAMS, REDUCE, IPC, DMABUF,
// PEER_ACCESS, STREAM_FLAGS, HOST_REGISTER, MEM_QUERY, IPC_EXTENT.
// Behaviour:
//  - The host never sets a current device: every entry derives it from its pointer
//    (cudaPointerGetAttributes) or stream (cudaStreamGetDevice), makes it current and
//    gives the calling thread its previous device back on return.
//  - A NULL stream means synchronous: the work goes to the per-thread default stream
//    (which does not serialise with other streams) and is waited for; host-to-host
//    copies are a plain memcpy. A stream may be an application's cudaStream_t.
//  - Every device allocation is cudaMalloc memory, so DEVICE and SHAREABLE blocks
//    (and an application's own cudaMalloc buffers) can all be exported with cudaIpc;
//    pinned host memory is cudaHostAlloc(portable | mapped).
//  - Reduce/divide kernels: cuda_reduce.cu, bit-identical to the cpu provider.
// Limits: IPC only for cudaMalloc memory (not cudaMallocAsync pools or cuMem*
// allocations); dma-buf needs a driver and GPU that support it (open kernel modules);
// stream flags need stream memory operations (CUDA 12+ drivers have them).
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <dlfcn.h>
#include <strings.h>

#include "cuda_state.h"

namespace hmc::cuda {
namespace {

constexpr hmc_param_t kParams[] = {
    {"HMC_CUDA_PEER_ACCESS", "bool", "1",
     "enable peer access between two local GPUs the first time a copy joins them "
     "(0: copies between GPUs go through the driver's staging)"},
    {"HMC_CUDA_REDUCE_BLOCKS", "int", "4",
     "thread blocks of 512 threads per multiprocessor for the reduce and divide kernels (1-32)"},
};

thread_local char t_last_error[512];

// ---- parameters --------------------------------------------------------------

bool parse_bool(const char* text, bool* out) {
  static constexpr const char* kTrue[] = {"1", "true", "yes", "on"};
  static constexpr const char* kFalse[] = {"0", "false", "no", "off"};
  for (const char* t : kTrue) {
    if (strcasecmp(text, t) == 0) return *out = true, true;
  }
  for (const char* f : kFalse) {
    if (strcasecmp(text, f) == 0) return *out = false, true;
  }
  return false;
}

// Reads one parameter's text: 1 unset, 0 set, -1 malformed (reason filled).
int read_text(const hmc_host_services_t& host, const char* name, char* text, size_t len,
              char* reason, size_t reason_len) {
  if (host.config_get == nullptr) return 1;
  const int rc = host.config_get(host.host, name, text, len);
  if (rc == 1) return 1;
  if (rc == 0) return 0;
  std::snprintf(reason, reason_len, "%s: value too long", name);
  return -1;
}

bool read_params(State* s, char* reason, size_t reason_len) {
  char text[64] = {};
  int rc = read_text(s->host, "HMC_CUDA_PEER_ACCESS", text, sizeof(text), reason, reason_len);
  if (rc < 0) return false;
  if (rc == 0 && !parse_bool(text, &s->peer_access)) {
    std::snprintf(reason, reason_len,
                  "HMC_CUDA_PEER_ACCESS: '%s' is not a bool (1/0, true/false, yes/no, on/off)", text);
    return false;
  }
  rc = read_text(s->host, "HMC_CUDA_REDUCE_BLOCKS", text, sizeof(text), reason, reason_len);
  if (rc < 0) return false;
  if (rc == 0) {
    char* end = nullptr;
    const long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > 32) {
      std::snprintf(reason, reason_len, "HMC_CUDA_REDUCE_BLOCKS: '%s' is not an integer from 1 to 32",
                    text);
      return false;
    }
    s->blocks_per_sm = static_cast<int>(v);
  }
  return true;
}

// ---- driver and devices ----------------------------------------------------------

// The calling thread's context, for DeviceGuard; found at init (missing: it restores the
// device number instead).
PFN_cuCtxGetCurrent_v4000 g_ctx_get_current = nullptr;
PFN_cuCtxSetCurrent_v4000 g_ctx_set_current = nullptr;

template <class Fn>
bool resolve(const char* symbol, unsigned version, Fn* out, std::string* why) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    if (why != nullptr) {
      *why = std::string(symbol) + ": " +
             (err != cudaSuccess ? cudaGetErrorString(err)
              : status == cudaDriverEntryPointVersionNotSufficent ? "driver too old"
                                                                   : "symbol not found");
    }
    cudaGetLastError();
    return false;
  }
  *out = reinterpret_cast<Fn>(fn);
  return true;
}

// NUMA node of a PCI device from sysfs; -1 when unknown.
int numa_node_of(const char* pci_bus_id) {
  char path[128];
  std::snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", pci_bus_id);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  int node = -1;
  if (std::fscanf(f, "%d", &node) != 1) node = -1;
  std::fclose(f);
  return node < 0 ? -1 : node;
}

// Fills s->devices; false with `reason` filled on failure.
bool describe_devices(State* s, int count, char* reason, size_t reason_len) {
  s->devices.resize(static_cast<size_t>(count));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    const cudaError_t err = cudaGetDeviceProperties(&prop, d);
    if (err != cudaSuccess) {
      std::snprintf(reason, reason_len, "no CUDA device: cudaGetDeviceProperties(%d): %s", d,
                    cudaGetErrorString(err));
      cudaGetLastError();
      return false;
    }
    Device& dev = s->devices[static_cast<size_t>(d)];
    hmc_device_info_t& info = dev.info;
    info.struct_size = sizeof(hmc_device_info_t);
    std::snprintf(info.vendor, sizeof(info.vendor), "nvidia");
    std::snprintf(info.model, sizeof(info.model), "%.95s", prop.name);
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), d) == cudaSuccess) {
      for (char* c = bus; *c != '\0'; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    } else {
      cudaGetLastError();
      std::snprintf(bus, sizeof(bus), "%04x:%02x:%02x.0", static_cast<unsigned>(prop.pciDomainID),
                    static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
    }
    std::snprintf(info.pci_bus_id, sizeof(info.pci_bus_id), "%s", bus);
    info.numa_node = numa_node_of(info.pci_bus_id);
    info.mem_kind = HMC_MEM_DEVICE;
    info.memory_bytes = prop.totalGlobalMem;
    std::memcpy(dev.uuid.data(), prop.uuid.bytes, dev.uuid.size());
    dev.sm_count = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
  }
  s->peer_enabled.assign(static_cast<size_t>(count), std::vector<char>(static_cast<size_t>(count), 0));
  return true;
}

// Loads the driver and counts devices; HMC_PROV_OK or UNAVAILABLE with the reason.
int open_driver(State* s, int* count, char* reason, size_t reason_len) {
  s->libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (s->libcuda == nullptr) {
    const char* why = dlerror();
    std::snprintf(reason, reason_len, "no CUDA driver: libcuda.so.1 not found (%s)",
                  why != nullptr ? why : "dlopen failed");
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    cudaGetLastError();
    std::snprintf(reason, reason_len, "no CUDA driver: libcuda.so.1 loaded but reports no driver version");
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  const cudaError_t err = cudaGetDeviceCount(count);
  cudaGetLastError();
  if (err == cudaErrorInsufficientDriver) {
    std::snprintf(reason, reason_len,
                  "no CUDA driver: the driver supports CUDA %d.%d, this provider's runtime needs %d.%d "
                  "(cudaGetDeviceCount: %s)",
                  driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                  cudaGetErrorString(err));
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  if (err != cudaSuccess || *count <= 0) {
    std::snprintf(reason, reason_len, "no CUDA device: cudaGetDeviceCount: %s",
                  err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  std::string why;
  if (!resolve("cuGetErrorString", 6000, &s->drv.get_error_string, &why) ||
      !resolve("cuMemGetAddressRange", 3020, &s->drv.mem_get_address_range, &why) ||
      !resolve("cuDeviceGetAttribute", 2000, &s->drv.device_get_attribute, &why) ||
      !resolve("cuPointerGetAttributes", 7000, &s->drv.pointer_get_attributes, &why)) {
    std::snprintf(reason, reason_len, "no CUDA driver: entry point %s", why.c_str());
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  if (!resolve("cuCtxGetCurrent", 4000, &g_ctx_get_current, &why) ||
      !resolve("cuCtxSetCurrent", 4000, &g_ctx_set_current, &why)) {
    g_ctx_get_current = nullptr;
    log(s, HMC_LOG_DEBUG, "a thread's device is restored by number: %s", why.c_str());
  }
  if (!resolve("cuStreamWaitValue32", 12000, &s->drv.stream_wait_value32, &why)) {
    log(s, HMC_LOG_DEBUG, "stream flags unsupported: %s", why.c_str());
  }
  if (!resolve("cuMemGetHandleForAddressRange", 11070, &s->drv.mem_get_handle_for_range, &why)) {
    log(s, HMC_LOG_DEBUG, "dma-buf export unsupported: %s", why.c_str());
  }
  return HMC_PROV_OK;
}

// ---- lifetime ------------------------------------------------------------------

int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  char scratch[8];
  if (reason == nullptr || reason_len == 0) {
    reason = scratch;
    reason_len = sizeof(scratch);
  }
  reason[0] = '\0';
  if (state == nullptr) {
    std::snprintf(reason, reason_len, "init: null state pointer");
    return HMC_PROV_ERR_INVALID;
  }
  *state = nullptr;
  if (host == nullptr || host->struct_size < sizeof(hmc_host_services_t)) {
    std::snprintf(reason, reason_len, "init: host services missing or smaller than ABI v1");
    return HMC_PROV_ERR_INVALID;
  }
  auto* s = new (std::nothrow) State;
  if (s == nullptr) {
    std::snprintf(reason, reason_len, "init: out of memory");
    return HMC_PROV_ERR_NO_MEMORY;
  }
  s->host = *host;
  if (!read_params(s, reason, reason_len)) {
    delete s;
    return HMC_PROV_ERR_INVALID;
  }
  int count = 0;
  int rc = open_driver(s, &count, reason, reason_len);
  if (rc == HMC_PROV_OK && !describe_devices(s, count, reason, reason_len)) rc = HMC_PROV_ERR_UNAVAILABLE;
  if (rc != HMC_PROV_OK) {
    log(s, HMC_LOG_DEBUG, "unavailable: %s", reason);
    if (s->libcuda != nullptr) dlclose(s->libcuda);
    delete s;
    return rc;
  }
  for (int d = 0; d < count; ++d) {
    const hmc_device_info_t& info = s->devices[static_cast<size_t>(d)].info;
    log(s, HMC_LOG_DEBUG, "device %d: %s, pci %s, numa node %d, %llu bytes, %d multiprocessors", d,
        info.model, info.pci_bus_id, info.numa_node,
        static_cast<unsigned long long>(info.memory_bytes), s->devices[static_cast<size_t>(d)].sm_count);
  }
  *state = s;
  return HMC_PROV_OK;
}

void fini(void* state) {
  auto* s = static_cast<State*>(state);
  if (s == nullptr) return;
  release_ipc(s);
  release_all(s);
  if (s->libcuda != nullptr) dlclose(s->libcuda);
  delete s;
}

const char* last_error(void* state) { return last_error_text(); }

int device_count(void* state, int* count) {
  if (count == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_count: null output pointer");
  *count = static_cast<int>(static_cast<const State*>(state)->devices.size());
  return HMC_PROV_OK;
}

int device_info(void* state, int device, hmc_device_info_t* info) {
  const auto* s = static_cast<const State*>(state);
  if (info == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_info: null output pointer");
  if (const int rc = check_device(s, device, "device_info"); rc != HMC_PROV_OK) return rc;
  if (info->struct_size < sizeof(hmc_device_info_t)) {
    return fail(HMC_PROV_ERR_INVALID,
                "device_info: info->struct_size is %zu; set it to sizeof(hmc_device_info_t) = %zu",
                info->struct_size, sizeof(hmc_device_info_t));
  }
  *info = s->devices[static_cast<size_t>(device)].info;
  return HMC_PROV_OK;
}

int peer_access(void* state, int device, int peer_device, int* can_access) {
  const auto* s = static_cast<const State*>(state);
  if (can_access == nullptr) return fail(HMC_PROV_ERR_INVALID, "peer_access: null output pointer");
  if (const int rc = check_device(s, device, "peer_access"); rc != HMC_PROV_OK) return rc;
  if (const int rc = check_device(s, peer_device, "peer_access"); rc != HMC_PROV_OK) return rc;
  if (device == peer_device) {
    *can_access = 1;
    return HMC_PROV_OK;
  }
  int can = 0;
  const cudaError_t err = cudaDeviceCanAccessPeer(&can, device, peer_device);
  if (err != cudaSuccess) return fail_cuda(err, "peer_access", "cudaDeviceCanAccessPeer");
  *can_access = can != 0 ? 1 : 0;
  return HMC_PROV_OK;
}

// ---- streams and events ------------------------------------------------------------
//
// A stream is a plain cudaStream_t (so that an application's own works too); an
// event is wrapped with its device, which event_record on the NULL stream needs.

constexpr uint32_t kEventTag = 0x43455654;  // "CEVT"

struct Event {
  uint32_t tag = kEventTag;
  int device = 0;
  cudaEvent_t event = nullptr;
};

int check_event(void* event, const char* what, Event** out) {
  auto* e = static_cast<Event*>(event);
  if (e == nullptr) return fail(HMC_PROV_ERR_INVALID, "%s: null event", what);
  if (e->tag != kEventTag) return fail(HMC_PROV_ERR_INVALID, "%s: %p is not an event of this provider", what, event);
  *out = e;
  return HMC_PROV_OK;
}

int stream_create(void* state, int device, void** stream) {
  const auto* s = static_cast<const State*>(state);
  if (stream == nullptr) return fail(HMC_PROV_ERR_INVALID, "stream_create: null output pointer");
  *stream = nullptr;
  if (const int rc = check_device(s, device, "stream_create"); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(device, "stream_create"); rc != HMC_PROV_OK) return rc;
  cudaStream_t st = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (err != cudaSuccess) return fail_cuda(err, "stream_create", "cudaStreamCreateWithFlags");
  *stream = st;
  return HMC_PROV_OK;
}

int stream_destroy(void* state, void* stream) {
  if (stream == nullptr) return fail(HMC_PROV_ERR_INVALID, "stream_destroy: null stream");
  int device = 0;
  if (const int rc = stream_device(stream, "stream_destroy", &device); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(device, "stream_destroy"); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "stream_destroy", "cudaStreamDestroy");
}

int stream_query(void* state, void* stream) {
  if (stream == nullptr) return HMC_PROV_OK;  // the synchronous stream has nothing pending
  const cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (err == cudaSuccess) return HMC_PROV_OK;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return HMC_PROV_IN_PROGRESS;
  }
  return fail_cuda(err, "stream_query", "cudaStreamQuery");
}

int event_create(void* state, int device, void** event) {
  const auto* s = static_cast<const State*>(state);
  if (event == nullptr) return fail(HMC_PROV_ERR_INVALID, "event_create: null output pointer");
  *event = nullptr;
  if (const int rc = check_device(s, device, "event_create"); rc != HMC_PROV_OK) return rc;
  auto* e = new (std::nothrow) Event;
  if (e == nullptr) return fail(HMC_PROV_ERR_NO_MEMORY, "event_create: out of memory");
  e->device = device;
  DeviceGuard guard;
  if (const int rc = guard.use(device, "event_create"); rc != HMC_PROV_OK) {
    delete e;
    return rc;
  }
  const cudaError_t err = cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    delete e;
    return fail_cuda(err, "event_create", "cudaEventCreateWithFlags");
  }
  *event = e;
  return HMC_PROV_OK;
}

int event_destroy(void* state, void* event) {
  Event* e = nullptr;
  if (const int rc = check_event(event, "event_destroy", &e); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(e->device, "event_destroy"); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaEventDestroy(e->event);
  e->tag = 0;  // a second destroy fails instead of freeing twice
  delete e;
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "event_destroy", "cudaEventDestroy");
}

int event_record(void* state, void* event, void* stream) {
  Event* e = nullptr;
  if (const int rc = check_event(event, "event_record", &e); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(e->device, "event_record"); rc != HMC_PROV_OK) return rc;
  // The NULL stream is synchronous: everything queued through it is done, so the
  // event is recorded on the (idle) per-thread stream and completes at once.
  cudaStream_t st = stream != nullptr ? static_cast<cudaStream_t>(stream) : cudaStreamPerThread;
  const cudaError_t err = cudaEventRecord(e->event, st);
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "event_record", "cudaEventRecord");
}

int stream_wait_event(void* state, void* stream, void* event) {
  Event* e = nullptr;
  if (const int rc = check_event(event, "stream_wait_event", &e); rc != HMC_PROV_OK) return rc;
  if (stream == nullptr) {  // synchronous: wait here
    const cudaError_t err = cudaEventSynchronize(e->event);
    return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "stream_wait_event", "cudaEventSynchronize");
  }
  int device = 0;
  if (const int rc = stream_device(stream, "stream_wait_event", &device); rc != HMC_PROV_OK) return rc;
  DeviceGuard guard;
  if (const int rc = guard.use(device, "stream_wait_event"); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e->event, 0);
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, "stream_wait_event", "cudaStreamWaitEvent");
}

int event_query(void* state, void* event) {
  Event* e = nullptr;
  if (const int rc = check_event(event, "event_query", &e); rc != HMC_PROV_OK) return rc;
  const cudaError_t err = cudaEventQuery(e->event);
  if (err == cudaSuccess) return HMC_PROV_OK;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return HMC_PROV_IN_PROGRESS;
  }
  return fail_cuda(err, "event_query", "cudaEventQuery");
}

// ---- the table -------------------------------------------------------------------

constexpr hmc_device_provider_t kProvider = {
    .struct_size = sizeof(hmc_device_provider_t),
    .abi_version = HMC_DEVICE_ABI_VERSION,
    .name = "cuda",
    .caps = HMC_DEV_CAP_DEVICE_MEM | HMC_DEV_CAP_PINNED_HOST | HMC_DEV_CAP_SHAREABLE |
            HMC_DEV_CAP_STREAMS | HMC_DEV_CAP_REDUCE | HMC_DEV_CAP_IPC | HMC_DEV_CAP_DMABUF |
            HMC_DEV_CAP_PEER_ACCESS | HMC_DEV_CAP_STREAM_FLAGS | HMC_DEV_CAP_HOST_REGISTER |
            HMC_DEV_CAP_MEM_QUERY | HMC_DEV_CAP_IPC_EXTENT,
    .params = kParams,
    .num_params = sizeof(kParams) / sizeof(kParams[0]),
    .init = init,
    .fini = fini,
    .last_error = last_error,
    .device_count = device_count,
    .device_info = device_info,
    .mem_alloc = mem_alloc,
    .mem_free = mem_free,
    .copy = copy,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_query = stream_query,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .stream_wait_event = stream_wait_event,
    .event_query = event_query,
    .reduce = reduce,
    .divide = divide,
    .ipc_export = ipc_export,
    .ipc_import = ipc_import,
    .ipc_close = ipc_close,
    .dmabuf_export = dmabuf_export,
    .peer_access = peer_access,
    .flag_alloc = flag_alloc,
    .flag_free = flag_free,
    .stream_wait_flag = stream_wait_flag,
    .host_register = host_register,
    .host_unregister = host_unregister,
    .mem_query = mem_query,
    .ipc_extent = ipc_extent,
};

}  // namespace

// ---- helpers shared by the provider's files ----------------------------------------

int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, args);
  va_end(args);
  return code;
}

int code_of(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return HMC_PROV_OK;
    case cudaErrorMemoryAllocation: return HMC_PROV_ERR_NO_MEMORY;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorMapBufferObjectFailed: return HMC_PROV_ERR_INVALID;
    case cudaErrorNotSupported: return HMC_PROV_ERR_UNSUPPORTED;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable: return HMC_PROV_ERR_UNAVAILABLE;
    default: return HMC_PROV_ERR_INTERNAL;
  }
}

int fail_cuda(cudaError_t err, const char* what, const char* call) {
  cudaGetLastError();  // a non-sticky error must not be reported again by a later call
  return fail(code_of(err), "%s: %s: %s (%s)", what, call, cudaGetErrorString(err), cudaGetErrorName(err));
}

int fail_cu(const State* s, CUresult res, const char* what, const char* call) {
  const char* text = nullptr;
  if (s->drv.get_error_string == nullptr || s->drv.get_error_string(res, &text) != CUDA_SUCCESS ||
      text == nullptr) {
    text = "unknown driver error";
  }
  int code = HMC_PROV_ERR_INTERNAL;
  switch (res) {
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND: code = HMC_PROV_ERR_INVALID; break;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED: code = HMC_PROV_ERR_UNSUPPORTED; break;
    case CUDA_ERROR_OUT_OF_MEMORY: code = HMC_PROV_ERR_NO_MEMORY; break;
    default: break;
  }
  return fail(code, "%s: %s: %s (CUresult %d)", what, call, text, static_cast<int>(res));
}

const char* last_error_text() { return t_last_error; }

void log(const State* s, int level, const char* fmt, ...) {
  if (s == nullptr || s->host.log == nullptr) return;
  char message[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  s->host.log(s->host.host, level, "cuda", message);
}

int DeviceGuard::use(int device, const char* what) {
  int current = -1;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return fail_cuda(err, what, "cudaGetDevice");
  if (current == device) return HMC_PROV_OK;
  CUcontext ctx = nullptr;
  const bool have_ctx = g_ctx_get_current != nullptr && g_ctx_set_current != nullptr &&
                        g_ctx_get_current(&ctx) == CUDA_SUCCESS;
  err = cudaSetDevice(device);
  if (err != cudaSuccess) return fail_cuda(err, what, "cudaSetDevice");
  if (!changed_) {
    previous_ = current;
    previous_ctx_ = ctx;
    have_ctx_ = have_ctx;
    changed_ = true;
  }
  return HMC_PROV_OK;
}

DeviceGuard::~DeviceGuard() {
  if (!changed_) return;
  if (have_ctx_) g_ctx_set_current(previous_ctx_);
  else cudaSetDevice(previous_);
}

int pointer_info(const void* p, const char* what, PointerInfo* out) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) return fail_cuda(err, what, "cudaPointerGetAttributes");
  out->type = attr.type;
  out->device = attr.device;
  return HMC_PROV_OK;
}

int stream_device(void* stream, const char* what, int* device) {
  const cudaError_t err = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), device);
  return err == cudaSuccess ? HMC_PROV_OK : fail_cuda(err, what, "cudaStreamGetDevice");
}

int check_device(const State* s, int device, const char* what) {
  if (device < 0 || static_cast<size_t>(device) >= s->devices.size()) {
    return fail(HMC_PROV_ERR_INVALID, "%s: no device %d (this process sees %zu)", what, device,
                s->devices.size());
  }
  return HMC_PROV_OK;
}

void ensure_peer(State* s, int device, int peer) {
  if (!s->peer_access || device == peer || device < 0 || peer < 0 ||
      static_cast<size_t>(device) >= s->devices.size() || static_cast<size_t>(peer) >= s->devices.size()) {
    return;
  }
  std::lock_guard lock(s->mutex);
  char& tried = s->peer_enabled[static_cast<size_t>(device)][static_cast<size_t>(peer)];
  if (tried) return;
  tried = 1;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || can == 0) {
    cudaGetLastError();
    log(s, HMC_LOG_DEBUG, "device %d cannot map device %d: copies between them are staged", device, peer);
    return;
  }
  DeviceGuard guard;
  if (guard.use(device, "peer access") != HMC_PROV_OK) return;
  const cudaError_t err = cudaDeviceEnablePeerAccess(peer, 0);
  if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) {
    log(s, HMC_LOG_DEBUG, "cudaDeviceEnablePeerAccess(%d -> %d): %s", device, peer, cudaGetErrorString(err));
  } else {
    log(s, HMC_LOG_DEBUG, "peer access enabled from device %d to device %d", device, peer);
  }
  cudaGetLastError();
}

}  // namespace hmc::cuda

extern "C" __attribute__((visibility("default"))) const hmc_device_provider_t* hmc_device_provider_v1(void) {
  return &hmc::cuda::kProvider;
}
