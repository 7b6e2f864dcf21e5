// HMC device provider "emu": an emulated GPU, for tests only (never installed; built
// into <build>/lib/test-providers, loaded with HMC_PROVIDER_PATH).
//
// Hardware: none; any Linux host. HMC_EMU_DEVICES devices (vendor "emu", model "HMC
// emulated device", HMC_MEM_DEVICE, no PCI id, NUMA -1) of HMC_EMU_MEMORY bytes each.
// Capabilities: DEVICE_MEM, PINNED_HOST, SHAREABLE, STREAMS, REDUCE, IPC, PEER_ACCESS,
// STREAM_FLAGS, HOST_REGISTER (checked and logged: emu_register.cpp), MEM_QUERY. What makes it
// useful: device memory the CPU cannot touch. Device pointers lie in PROT_NONE address
// space; the bytes live in memfd shadows that only this provider's copy, reduce, divide
// and IPC reach (emu_memory.cpp), so host code that reads, writes, sends or
// process_vm_writev's a device pointer faults or fails. A second instance in the same
// process plays an application's own runtime: each instance's copy, reduce, mem_query
// and ipc_export reach the other's device memory, as CUDA's do any cudaMalloc.
// Streams are real: a worker thread each, in order, with an optional delay per
// operation to expose work that runs too early (emu_stream.cpp).
// Limits:
//  - Every HMC_ALLOC_DEVICE allocation is a memfd (IPC-exportable): one fd each.
//  - Translation checks bounds against the size asked for, stricter than a GPU.
//  - A NULL stream runs on the caller; stream_wait_flag/stream_wait_event on it block
//    the caller until satisfied (no deadline). Flags are words from flag_alloc only.
//  - stream_destroy runs what can still run and drops the rest from the first wait
//    that is not satisfied (dropped event records fail their events).
//  - Work on a stream that fails (a dropped wait, a kernel's argument check) makes the
//    stream fail from then on, like a GPU's sticky error; stream_query reports it.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include "cpu_reduce.h"
#include "emu_ops.h"
#include "emu_stream.h"

namespace hmc::emu {
namespace {

constexpr hmc_param_t kParams[] = {
    {"HMC_EMU_DEVICES", "int", "2", "number of emulated devices (1 to 64)"},
    {"HMC_EMU_MEMORY", "size", "4G",
     "device memory per emulated device (address space reserved, pages used only when written)"},
    {"HMC_EMU_STREAM_DELAY_US", "int", "0",
     "microseconds each stream operation waits before it runs, to expose work that runs too early"},
    {"HMC_EMU_STREAM_WAKE", "int", "1",
     "1: a stream operation that ends wakes the host; 0: it wakes nobody, as with CUDA, so the "
     "host must poll its events"},
    {"HMC_EMU_QUERY_LAG_US", "int", "0",
     "microseconds an event query that finds the event not reached takes to answer, as a host "
     "preempted between its queries: later work of the stream may end meanwhile"},
    {"HMC_EMU_FAIL_STREAM_OP", "int", "0",
     "the n-th stream operation of this process (counted from 1 over all streams) fails, to test "
     "error paths; 0: none"},
    {"HMC_EMU_QUEUES", "int", "0",
     "hardware queues per device that the streams share, as CUDA_DEVICE_MAX_CONNECTIONS: work "
     "runs in submission order across the streams of a queue and a wait at its head holds it "
     "all (synchronous work takes the calling thread's queue); 0: every stream its own"},
    {"HMC_EMU_DEVICE_WIDE_FREES", "int", "0",
     "1: mem_free, host_unregister and ipc_close first wait until no stream has work queued, as "
     "cudaFree, cudaFreeHost, cudaHostUnregister and cudaIpcCloseMemHandle wait for the device; "
     "after 5 s they fail instead of hanging, noting \"device-wide-wait-stuck\" in the log"},
    {"HMC_EMU_EXPORT_FOREIGN", "int", "1",
     "0: ipc_export refuses memory another instance of this process allocated (the "
     "application's runtime, tests/device), as CUDA refuses cudaMallocAsync pool memory, noting "
     "\"ipc_export_refused\" in the log"},
    {"HMC_EMU_IMPORT_SAME_ADDRESS", "int", "1",
     "1: ipc_import fails while this process holds an import of another allocation the exporter "
     "had at the same address, as CUDA does (cudaErrorAlreadyMapped) when the exporter's "
     "allocator reuses a block the importer still maps, noting \"ipc_import_refused\"; 0: it "
     "imports"},
    {"HMC_EMU_FULL_NAMES", "int", "0",
     "1: device_info fills vendor, model and PCI id to their ends with no NUL (a host must not read "
     "past them)"},
    {"HMC_EMU_REGISTER_LOG", "string", "",
     "file that host_register/host_unregister append their events to, ipc_export/ipc_import "
     "each success (with the bytes of the range), and fini the streams, events and flags the "
     "host left (tests count them)"},
};

thread_local char t_last_error[512];

// Reads a parameter into `text`; false (reason filled) when malformed, true when unset.
bool read_param(const hmc_host_services_t& host, const char* name, char* text, size_t len,
                char* reason, size_t reason_len) {
  text[0] = '\0';
  if (host.config_get == nullptr) return true;
  const int rc = host.config_get(host.host, name, text, len);
  if (rc == 1) text[0] = '\0';
  if (rc < 0) std::snprintf(reason, reason_len, "%s: value too long", name);
  return rc >= 0;
}

bool read_int(const hmc_host_services_t& host, const char* name, long lo, long hi, long* value,
              char* reason, size_t reason_len) {
  char text[64];
  if (!read_param(host, name, text, sizeof(text), reason, reason_len)) return false;
  if (text[0] == '\0') return true;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) {
    std::snprintf(reason, reason_len, "%s: '%s' is not an integer from %ld to %ld", name, text, lo, hi);
    return false;
  }
  *value = v;
  return true;
}

// Sizes as core writes them: a whole number with an optional k/m/g/t (KiB...) suffix,
// optionally followed by "i" and/or "b" ("64M", "4GiB", "1024").
bool read_size(const hmc_host_services_t& host, const char* name, uint64_t* value, char* reason,
               size_t reason_len) {
  char text[64];
  if (!read_param(host, name, text, sizeof(text), reason, reason_len)) return false;
  if (text[0] == '\0') return true;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  int shift = 0;
  if (end != text && *end != '\0') {
    const char* units = "kmgt";
    const char* u = std::strchr(units, *end | 0x20);
    if (u != nullptr) shift = 10 * static_cast<int>(u - units + 1), ++end;
    if ((*end | 0x20) == 'i') ++end;
    if ((*end | 0x20) == 'b') ++end;
  }
  if (end == text || *end != '\0' || errno != 0 || text[0] == '-' || (v >> (62 - shift)) != 0) {
    std::snprintf(reason, reason_len, "%s: '%s' is not a size (e.g. 4G, 512M, 1048576)", name, text);
    return false;
  }
  *value = static_cast<uint64_t>(v) << shift;
  return true;
}

int reserve(State* s, char* reason, size_t reason_len) {
  constexpr uint64_t kMaxRange = uint64_t{1} << 46;  // 64 TiB of address space, at most
  const uint64_t windows = static_cast<uint64_t>(s->devices) + 1;
  s->memory = page_round(s->memory);
  if (s->memory < (1u << 20) || s->memory > kMaxRange / windows) {
    std::snprintf(reason, reason_len, "HMC_EMU_MEMORY: %llu bytes per device is not between 1M "
                  "and %llu", static_cast<unsigned long long>(s->memory),
                  static_cast<unsigned long long>(kMaxRange / windows));
    return HMC_PROV_ERR_INVALID;
  }
  s->range_len = s->memory * windows;
  void* p = mmap(nullptr, s->range_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::snprintf(reason, reason_len, "cannot reserve %zu bytes of address space: %s", s->range_len,
                  std::strerror(errno));
    return HMC_PROV_ERR_UNAVAILABLE;
  }
  s->range = p;
  for (uint64_t i = 0; i < windows; ++i) {
    Window w;
    w.base = reinterpret_cast<uintptr_t>(p) + i * s->memory;
    w.size = s->memory;
    w.free.emplace(w.base, w.size);
    s->windows.push_back(std::move(w));
  }
  return HMC_PROV_OK;
}

int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  char scratch[8];
  if (reason == nullptr || reason_len == 0) reason = scratch, reason_len = sizeof(scratch);
  reason[0] = '\0';
  if (state == nullptr || host == nullptr || host->struct_size < sizeof(hmc_host_services_t)) {
    std::snprintf(reason, reason_len, "init: null state pointer or host services smaller than v1");
    return HMC_PROV_ERR_INVALID;
  }
  *state = nullptr;
  auto* s = new (std::nothrow) State;
  if (s == nullptr) return std::snprintf(reason, reason_len, "init: out of memory"), HMC_PROV_ERR_NO_MEMORY;
  s->host = *host;
  s->cpu.wide = hmc::cpu::wide_kernels_supported();
  long devices = 2;
  long delay = 0, fail_op = 0, stream_wake = 1, query_lag = 0, queues = 0, wide_frees = 0, export_foreign = 1, same_address = 1,
       full_names = 0;
  s->memory = uint64_t{4} << 30;
  int rc = HMC_PROV_ERR_INVALID;
  if (read_int(*host, "HMC_EMU_DEVICES", 1, 64, &devices, reason, reason_len) &&
      read_size(*host, "HMC_EMU_MEMORY", &s->memory, reason, reason_len) &&
      read_int(*host, "HMC_EMU_STREAM_DELAY_US", 0, 10000000, &delay, reason, reason_len) &&
      read_int(*host, "HMC_EMU_STREAM_WAKE", 0, 1, &stream_wake, reason, reason_len) &&
      read_int(*host, "HMC_EMU_QUERY_LAG_US", 0, 1000000, &query_lag, reason, reason_len) &&
      read_int(*host, "HMC_EMU_FAIL_STREAM_OP", 0, 1L << 40, &fail_op, reason, reason_len) &&
      read_int(*host, "HMC_EMU_QUEUES", 0, 128, &queues, reason, reason_len) &&
      read_int(*host, "HMC_EMU_DEVICE_WIDE_FREES", 0, 1, &wide_frees, reason, reason_len) &&
      read_int(*host, "HMC_EMU_EXPORT_FOREIGN", 0, 1, &export_foreign, reason, reason_len) &&
      read_int(*host, "HMC_EMU_IMPORT_SAME_ADDRESS", 0, 1, &same_address, reason, reason_len) &&
      read_int(*host, "HMC_EMU_FULL_NAMES", 0, 1, &full_names, reason, reason_len)) {
    s->full_names = full_names != 0;
    s->import_same_address = same_address != 0;
    s->device_wide_frees = wide_frees != 0;
    s->export_foreign = export_foreign != 0;
    s->devices = static_cast<int>(devices);
    s->delay_us = static_cast<uint32_t>(delay);
    s->stream_wake = stream_wake != 0;
    s->query_lag_us = static_cast<uint32_t>(query_lag);
    s->fail_op = static_cast<uint64_t>(fail_op);
    s->queues = static_cast<uint32_t>(queues);
    if (queues > 0) {
      s->channels.resize(s->devices);
      for (auto& d : s->channels)
        for (long q = 0; q < queues; ++q) d.push_back(std::make_shared<Channel>());
      s->next_channel.assign(s->devices, 0);
    }
    char path[512];
    if (read_param(*host, "HMC_EMU_REGISTER_LOG", path, sizeof(path), reason, reason_len)) {
      s->register_log = path;
      rc = reserve(s, reason, reason_len);
    }
  }
  if (rc != HMC_PROV_OK) {
    delete s;
    return rc;
  }
  add_instance(s);
  log(s, HMC_LOG_DEBUG, "%d emulated devices of %llu bytes at %p, stream delay %u us, %u queues (0: per stream)", s->devices,
      static_cast<unsigned long long>(s->memory), s->range, s->delay_us, s->queues);
  *state = s;
  return HMC_PROV_OK;
}

void fini(void* state) {
  auto* s = static_cast<State*>(state);
  if (s == nullptr) return;
  remove_instance(s);  // first: another instance's copy may be translating our memory
  const Leftovers objects = release_objects(s);
  const size_t registered = release_registrations(s);
  const size_t blocks = release_memory(s);
  if (objects.streams) note(s, "left-streams", objects.streams);
  if (objects.events) note(s, "left-events", objects.events);
  if (objects.flags) note(s, "left-flags", objects.flags);
  if (objects.streams + objects.events + objects.flags + blocks + registered > 0) {
    log(s, HMC_LOG_WARN, "fini: released %zu streams, %zu events, %zu flags, %zu allocations/imports and %zu "
        "host registrations the host had not", objects.streams, objects.events, objects.flags, blocks, registered);
  }
  munmap(s->range, s->range_len);
  delete s;
}

const char* last_error(void* state) { return t_last_error; }

int device_count(void* state, int* count) {
  if (count == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_count: null output pointer");
  *count = static_cast<const State*>(state)->devices;
  return HMC_PROV_OK;
}

int device_info(void* state, int device, hmc_device_info_t* info) {
  const auto* s = static_cast<const State*>(state);
  if (info == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_info: null output pointer");
  if (device < 0 || device >= s->devices) {
    return fail(HMC_PROV_ERR_INVALID, "device_info: no device %d (this emulator has %d)", device,
                s->devices);
  }
  if (info->struct_size < sizeof(hmc_device_info_t)) {
    return fail(HMC_PROV_ERR_INVALID, "device_info: info->struct_size is %zu, need %zu",
                info->struct_size, sizeof(hmc_device_info_t));
  }
  *info = hmc_device_info_t{};
  info->struct_size = sizeof(hmc_device_info_t);
  std::snprintf(info->vendor, sizeof(info->vendor), "emu");
  std::snprintf(info->model, sizeof(info->model), "HMC emulated device");
  if (s->full_names) {
    std::memset(info->vendor, 'v', sizeof(info->vendor));
    std::memset(info->model, 'm', sizeof(info->model));
    std::memset(info->pci_bus_id, 'p', sizeof(info->pci_bus_id));
  }
  info->numa_node = -1;
  info->mem_kind = HMC_MEM_DEVICE;
  info->memory_bytes = s->memory;
  return HMC_PROV_OK;
}

constexpr hmc_device_provider_t kProvider = {
    .struct_size = sizeof(hmc_device_provider_t),
    .abi_version = HMC_DEVICE_ABI_VERSION,
    .name = "emu",
    .caps = HMC_DEV_CAP_DEVICE_MEM | HMC_DEV_CAP_PINNED_HOST | HMC_DEV_CAP_SHAREABLE |
            HMC_DEV_CAP_STREAMS | HMC_DEV_CAP_REDUCE | HMC_DEV_CAP_IPC | HMC_DEV_CAP_PEER_ACCESS |
            HMC_DEV_CAP_STREAM_FLAGS | HMC_DEV_CAP_HOST_REGISTER | HMC_DEV_CAP_MEM_QUERY |
            HMC_DEV_CAP_IPC_EXTENT,
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
    .dmabuf_export = nullptr,
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

int vfail(int code, const char* fmt, va_list args) {
  std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, args);
  return code;
}

int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vfail(code, fmt, args);
  va_end(args);
  return code;
}

const char* last_error_text() { return t_last_error; }

void log(const State* s, int level, const char* fmt, ...) {
  if (s == nullptr || s->host.log == nullptr) return;
  char message[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  s->host.log(s->host.host, level, "emu", message);
}

void wake(const State* s) {
  if (s->host.wake != nullptr) s->host.wake(s->host.host);
}

}  // namespace hmc::emu

extern "C" __attribute__((visibility("default"))) const hmc_device_provider_t* hmc_device_provider_v1(void) {
  return &hmc::emu::kProvider;
}
