// HMC device provider "cpu": the host itself as device 0.
//
// Hardware: any Linux host; no SDK. Device 0 describes the machine (vendor "cpu",
// /proc/cpuinfo model, physical memory, NUMA node 0 on a one-node host, -1 when it
// spans several). Capabilities: PINNED_HOST, SHAREABLE, STREAMS, REDUCE, IPC, IPC_EXTENT.
// HMC_ALLOC_DEVICE also works and returns host memory (the device's own kind), but
// DEVICE_MEM stays clear so that core never mistakes it for accelerator memory.
// Limits:
//  - Everything runs synchronously on the calling thread: copy, reduce and divide
//    have finished when they return, whatever stream is passed; streams and events
//    are tokens, stream_query/event_query always answer 0 (done), stream_wait_event
//    has nothing to wait for. Stream/event tokens are tagged, which catches a handle
//    of the wrong kind, not a use after destroy.
//  - Pinning is mlock, best effort (RLIMIT_MEMLOCK), see HMC_CPU_PIN.
//  - IPC works between processes of one user on one host, while the exporter is
//    alive and keeps the block (mappings already made stay valid).
//  - Reduce runs on the calling thread only; semantics in cpu_reduce.cpp. x86-64
//    CPUs with AVX2 and F16C get wider kernels (HMC_CPU_SIMD=baseline turns them off).
// The same sources build the plugin (entry hmc_device_provider_v1) and, with
// HMC_BUILTIN_PROVIDER defined, an object library linked into libhmc (entry
// hmc_builtin_device_cpu).
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include <dirent.h>
#include <strings.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cpu_memory.h"
#include "cpu_reduce.h"
#include "cpu_state.h"

namespace hmc::cpu {
namespace {

constexpr hmc_param_t kParams[] = {
    {"HMC_CPU_PIN", "bool", "1",
     "mlock HMC_ALLOC_PINNED_HOST blocks (a failure leaves them pageable and is logged at debug)"},
    {"HMC_CPU_HUGE_PAGES", "bool", "1",
     "put plain host blocks of 64 KiB and more on transparent huge pages where the kernel offers "
     "them (cheaper cross-process reads by peers; costs up to 2x the size asked)"},
    {"HMC_CPU_SIMD", "string", "auto",
     "reduce kernels: auto (AVX2/F16C where the CPU has them) or baseline (portable loops only)"},
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

// Reads a bool parameter; false (with `reason` filled) when the value is malformed.
bool read_bool(const hmc_host_services_t& host, const char* name, bool* value, char* reason,
               size_t reason_len) {
  if (host.config_get == nullptr) return true;
  char text[64] = {};
  const int rc = host.config_get(host.host, name, text, sizeof(text));
  if (rc == 1) return true;  // unset: keep the default
  if (rc == 0 && parse_bool(text, value)) return true;
  std::snprintf(reason, reason_len, "%s: '%s' is not a bool (1/0, true/false, yes/no, on/off)",
                name, rc == 0 ? text : "<too long>");
  return false;
}

// Reads HMC_CPU_SIMD into s->wide; false (with `reason` filled) when malformed.
bool read_simd(State* s, char* reason, size_t reason_len) {
  s->wide = wide_kernels_supported();
  if (s->host.config_get == nullptr) return true;
  char text[64] = {};
  const int rc = s->host.config_get(s->host.host, "HMC_CPU_SIMD", text, sizeof(text));
  if (rc == 1 || (rc == 0 && strcasecmp(text, "auto") == 0)) return true;
  if (rc == 0 && strcasecmp(text, "baseline") == 0) {
    s->wide = false;
    return true;
  }
  std::snprintf(reason, reason_len, "HMC_CPU_SIMD: '%s' is not auto or baseline",
                rc == 0 ? text : "<too long>");
  return false;
}

// ---- device description --------------------------------------------------------

void read_model(char* out, size_t len) {
  if (FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::strncmp(line, "model name", 10) != 0) continue;
      const char* v = std::strchr(line, ':');
      if (v == nullptr) continue;
      ++v;
      while (*v == ' ' || *v == '\t') ++v;
      std::snprintf(out, len, "%s", v);
      out[std::strcspn(out, "\n")] = '\0';
      break;
    }
    std::fclose(f);
  }
  if (out[0] == '\0') {  // no "model name" (arm64 kernels): the machine name will do
    utsname u{};
    std::snprintf(out, len, "%s", uname(&u) == 0 ? u.machine : "unknown");
  }
}

// 0 on a host with one NUMA node; -1 when it has several (device 0 spans them) or
// the kernel does not say.
int numa_node_of_host() {
  DIR* dir = opendir("/sys/devices/system/node");
  if (dir == nullptr) return -1;
  int nodes = 0;
  while (const dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, "node", 4) == 0 && std::isdigit(static_cast<unsigned char>(e->d_name[4]))) {
      ++nodes;
    }
  }
  closedir(dir);
  return nodes == 1 ? 0 : -1;
}

void describe_host(hmc_device_info_t* info) {
  *info = hmc_device_info_t{};
  info->struct_size = sizeof(hmc_device_info_t);
  std::snprintf(info->vendor, sizeof(info->vendor), "cpu");
  read_model(info->model, sizeof(info->model));
  info->numa_node = numa_node_of_host();
  info->mem_kind = HMC_MEM_HOST;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  info->memory_bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// ---- lifetime ------------------------------------------------------------------

int init(const hmc_host_services_t* host, void** state, char* reason, size_t reason_len) {
  char scratch[8];
  if (reason == nullptr || reason_len == 0) {  // still have somewhere to write
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
  bool huge = true;
  if (!read_bool(*host, "HMC_CPU_PIN", &s->pin, reason, reason_len) ||
      !read_bool(*host, "HMC_CPU_HUGE_PAGES", &huge, reason, reason_len) ||
      !read_simd(s, reason, reason_len)) {
    delete s;
    return HMC_PROV_ERR_INVALID;
  }
  const size_t huge_page = huge ? HugeArena::system_page() : 0;
  if (huge_page != 0) s->huge.reset(new (std::nothrow) HugeArena(huge_page));  // null: small pages
  describe_host(&s->info);
  log(s, HMC_LOG_DEBUG,
      "device 0: %s, %llu bytes, numa node %d, pin %d, %s reduce kernels, huge pages %zu KiB%s",
      s->info.model, static_cast<unsigned long long>(s->info.memory_bytes), s->info.numa_node,
      s->pin ? 1 : 0, s->wide ? "avx2/f16c" : "baseline", huge_page >> 10,
      huge && huge_page == 0 ? " (transparent huge pages off in this kernel)" : "");
  *state = s;
  return HMC_PROV_OK;
}

void fini(void* state) {
  auto* s = static_cast<State*>(state);
  if (s == nullptr) return;
  if (const size_t left = release_all(s)) {
    log(s, HMC_LOG_WARN, "fini: released %zu blocks or mappings the host had not freed", left);
  }
  delete s;
}

const char* last_error(void* state) { return last_error_text(); }

int device_count(void* state, int* count) {
  if (count == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_count: null output pointer");
  *count = 1;
  return HMC_PROV_OK;
}

// The caller sets info->struct_size to the size it allocated, so that a later,
// larger hmc_device_info_t is never written past an older caller's struct.
int device_info(void* state, int device, hmc_device_info_t* info) {
  const auto* s = static_cast<const State*>(state);
  if (info == nullptr) return fail(HMC_PROV_ERR_INVALID, "device_info: null output pointer");
  if (device != 0) {
    return fail(HMC_PROV_ERR_INVALID, "device_info: no device %d (the cpu provider has device 0)",
                device);
  }
  if (info->struct_size < sizeof(hmc_device_info_t)) {
    return fail(HMC_PROV_ERR_INVALID,
                "device_info: info->struct_size is %zu; set it to sizeof(hmc_device_info_t) = %zu",
                info->struct_size, sizeof(hmc_device_info_t));
  }
  *info = s->info;
  return HMC_PROV_OK;
}

// ---- streams and events: tokens, since all work is synchronous ---------------------

constexpr uint32_t kStreamTag = 0x5354524d;  // "STRM"
constexpr uint32_t kEventTag = 0x45564e54;   // "EVNT"

struct Token {
  uint32_t tag;
};

int make_token(const char* what, int device, uint32_t tag, void** out) {
  if (out == nullptr) return fail(HMC_PROV_ERR_INVALID, "%s: null output pointer", what);
  *out = nullptr;
  if (device != 0) return fail(HMC_PROV_ERR_INVALID, "%s: no device %d", what, device);
  auto* t = new (std::nothrow) Token{tag};
  if (t == nullptr) return fail(HMC_PROV_ERR_NO_MEMORY, "%s: out of memory", what);
  *out = t;
  return HMC_PROV_OK;
}

// A null stream is the synchronous stream and is always valid; a null event is not.
int check_token(const char* what, const void* p, uint32_t tag, bool null_ok) {
  if (p == nullptr) {
    return null_ok ? HMC_PROV_OK : fail(HMC_PROV_ERR_INVALID, "%s: null handle", what);
  }
  if (static_cast<const Token*>(p)->tag != tag) {
    return fail(HMC_PROV_ERR_INVALID, "%s: %p is not a %s of this provider", what, p,
                tag == kStreamTag ? "stream" : "event");
  }
  return HMC_PROV_OK;
}

int drop_token(const char* what, void* p, uint32_t tag) {
  const int rc = check_token(what, p, tag, false);
  if (rc != HMC_PROV_OK) return rc;
  static_cast<Token*>(p)->tag = 0;  // a second destroy then fails instead of freeing twice
  delete static_cast<Token*>(p);
  return HMC_PROV_OK;
}

int stream_create(void* state, int device, void** stream) {
  return make_token("stream_create", device, kStreamTag, stream);
}
int stream_destroy(void* state, void* stream) { return drop_token("stream_destroy", stream, kStreamTag); }
int stream_query(void* state, void* stream) { return check_token("stream_query", stream, kStreamTag, true); }
int event_create(void* state, int device, void** event) {
  return make_token("event_create", device, kEventTag, event);
}
int event_destroy(void* state, void* event) { return drop_token("event_destroy", event, kEventTag); }
int event_record(void* state, void* event, void* stream) {
  const int rc = check_token("event_record", event, kEventTag, false);
  return rc != HMC_PROV_OK ? rc : check_token("event_record", stream, kStreamTag, true);
}
int stream_wait_event(void* state, void* stream, void* event) {
  const int rc = check_token("stream_wait_event", event, kEventTag, false);
  return rc != HMC_PROV_OK ? rc : check_token("stream_wait_event", stream, kStreamTag, true);
}
int event_query(void* state, void* event) { return check_token("event_query", event, kEventTag, false); }

// ---- the table -------------------------------------------------------------------

constexpr hmc_device_provider_t kProvider = {
    .struct_size = sizeof(hmc_device_provider_t),
    .abi_version = HMC_DEVICE_ABI_VERSION,
    .name = "cpu",
    .caps = HMC_DEV_CAP_PINNED_HOST | HMC_DEV_CAP_SHAREABLE | HMC_DEV_CAP_STREAMS |
            HMC_DEV_CAP_REDUCE | HMC_DEV_CAP_IPC | HMC_DEV_CAP_IPC_EXTENT,
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
    .peer_access = nullptr,
    .flag_alloc = nullptr,
    .flag_free = nullptr,
    .stream_wait_flag = nullptr,
    .host_register = nullptr,
    .host_unregister = nullptr,
    .mem_query = nullptr,  // host memory is all it has
    .ipc_extent = ipc_extent,
};

}  // namespace

int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(t_last_error, sizeof(t_last_error), fmt, args);
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
  s->host.log(s->host.host, level, "cpu", message);
}

}  // namespace hmc::cpu

#ifdef HMC_BUILTIN_PROVIDER
#define HMC_CPU_ENTRY hmc_builtin_device_cpu
#else
#define HMC_CPU_ENTRY hmc_device_provider_v1
#endif

extern "C" __attribute__((visibility("default"))) const hmc_device_provider_t* HMC_CPU_ENTRY(void) {
  return &hmc::cpu::kProvider;
}
