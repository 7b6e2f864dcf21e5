// Device memory of the emulated device: PROT_NONE address space whose bytes live in
// memfd shadows, and the copies between any two kinds of memory.
//
// init reserves one range (MAP_NORESERVE) cut into a window per device plus one for
// imports; an allocation takes a page-rounded piece of its device's window (first
// fit) and a memfd of its own, mapped read-write elsewhere. Only translate() turns a
// device pointer into its shadow, so the CPU touching a device pointer faults, and a
// syscall given one (send, process_vm_writev) fails with EFAULT.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include <sys/mman.h>
#include <unistd.h>

#include "emu_ops.h"
#include "emu_stream.h"

namespace hmc::emu {

Shadow::~Shadow() {
  if (host != nullptr) munmap(host, length);
  if (fd >= 0) close(fd);
}

namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Distinct across processes and provider instances, so an importer can tell the
// exported memfd from a file that reused its fd number.
uint64_t next_memfd_id() {
  static std::atomic<uint64_t> counter{[] {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }()};
  return counter.fetch_add(1);
}

int make_shadow(size_t length, ShadowRef* out) {
  auto sh = std::make_shared<Shadow>();
  sh->id = next_memfd_id();
  char name[64];
  std::snprintf(name, sizeof(name), "hmc-emu-%llu", static_cast<unsigned long long>(sh->id));
  sh->fd = memfd_create(name, MFD_CLOEXEC);
  if (sh->fd < 0) return fail(HMC_PROV_ERR_NO_MEMORY, "memfd_create: %s", std::strerror(errno));
  if (ftruncate(sh->fd, static_cast<off_t>(length)) != 0) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "ftruncate of a %zu-byte memfd: %s", length,
                std::strerror(errno));
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, sh->fd, 0);
  if (p == MAP_FAILED) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mmap of a %zu-byte memfd: %s", length, std::strerror(errno));
  }
  sh->host = static_cast<char*>(p);
  sh->length = length;
  *out = std::move(sh);
  return HMC_PROV_OK;
}

int alloc_device(State* s, int device, size_t bytes, void** ptr) {
  const size_t extent = page_round(bytes);
  if (extent == 0 || extent > s->memory) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: %zu bytes is more than device %d has (%llu)",
                bytes, device, static_cast<unsigned long long>(s->memory));
  }
  Allocation a;
  a.bytes = bytes;
  a.extent = extent;
  a.window = device;
  if (const int rc = make_shadow(extent, &a.shadow); rc != HMC_PROV_OK) return rc;
  std::unique_lock lock(s->mem_mu);
  const uintptr_t base = window_take(s->windows[device], extent);
  if (base == 0) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: device %d has no free range of %zu bytes left",
                device, extent);
  }
  s->allocs.emplace(base, std::move(a));
  *ptr = reinterpret_cast<void*>(base);
  return HMC_PROV_OK;
}

std::shared_mutex g_instances_mu;  // guards g_instances
std::vector<State*> g_instances;   // see add_instance

// The live allocation holding byte `addr`, or allocs.end(); the caller holds mem_mu.
std::map<uintptr_t, Allocation>::const_iterator holding(const State* s, uintptr_t addr) {
  auto it = s->allocs.upper_bound(addr);
  if (it == s->allocs.begin()) return s->allocs.end();
  --it;
  return addr - it->first < it->second.bytes ? it : s->allocs.end();
}

// find_device in the allocations of `owner`, whose device address space holds p.
int find_in(State* owner, const char* what, const void* p, size_t bytes, Held* out) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::shared_lock lock(owner->mem_mu);
  const auto it = holding(owner, addr);
  if (it != owner->allocs.end() && bytes <= it->second.bytes - (addr - it->first)) {
    out->device = it->second.window == owner->devices ? -1 : it->second.window;
    out->base = it->first;
    out->bytes = it->second.bytes;
    out->shadow = it->second.shadow;
    return HMC_PROV_OK;
  }
  return fail(HMC_PROV_ERR_INVALID,
              "%s: [%p, +%zu) is device memory outside any live allocation (freed, never "
              "allocated, or past the end of one)", what, p, bytes);
}

int alloc_pinned(State* s, size_t bytes, void** ptr) {
  const size_t length = page_round(bytes);
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: mmap of %zu bytes: %s", length,
                std::strerror(errno));
  }
  std::unique_lock lock(s->mem_mu);
  s->pinned.emplace(reinterpret_cast<uintptr_t>(p), length);
  *ptr = p;
  return HMC_PROV_OK;
}

}  // namespace

size_t page_round(size_t bytes) {
  const size_t page = page_size();
  return bytes > SIZE_MAX - page ? 0 : (bytes + page - 1) / page * page;
}

uintptr_t window_take(Window& w, size_t extent) {
  for (auto it = w.free.begin(); it != w.free.end(); ++it) {
    if (it->second < extent) continue;
    const uintptr_t base = it->first;
    const size_t left = it->second - extent;
    w.free.erase(it);
    if (left > 0) w.free.emplace(base + extent, left);
    return base;
  }
  return 0;
}

void window_give(Window& w, uintptr_t base, size_t extent) {
  auto next = w.free.lower_bound(base);
  if (next != w.free.end() && base + extent == next->first) {  // merge with the range after
    extent += next->second;
    next = w.free.erase(next);
  }
  if (next != w.free.begin()) {  // and with the one before
    auto prev = std::prev(next);
    if (prev->first + prev->second == base) {
      prev->second += extent;
      return;
    }
  }
  w.free.emplace(base, extent);
}

int window_of(const State* s, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto lo = reinterpret_cast<uintptr_t>(s->range);
  if (a < lo || a >= lo + s->range_len) return -1;
  return static_cast<int>((a - lo) / s->memory);
}

void add_instance(State* s) {
  std::unique_lock lock(g_instances_mu);
  g_instances.push_back(s);
}

void remove_instance(State* s) {
  std::unique_lock lock(g_instances_mu);
  g_instances.erase(std::find(g_instances.begin(), g_instances.end(), s));
}

bool any_import_at(const std::string& exporter_at, const std::string& key) {
  std::shared_lock lock(g_instances_mu);
  for (State* s : g_instances) {
    std::shared_lock mem(s->mem_mu);
    for (const auto& [base, a] : s->allocs)
      if (a.window == s->devices && a.exporter_at == exporter_at && a.import_key != key) return true;
  }
  return false;
}

int find_device(State* s, const char* what, const void* p, size_t bytes, Held* out) {
  if (window_of(s, p) >= 0) return find_in(s, what, p, bytes, out);
  std::shared_lock lock(g_instances_mu);
  for (State* owner : g_instances) {
    if (owner != s && window_of(owner, p) >= 0) return find_in(owner, what, p, bytes, out);
  }
  return 1;
}

int translate(State* s, const char* what, const void* p, size_t bytes, View* out) {
  Held held;
  const int rc = find_device(s, what, p, bytes, &held);
  if (rc == 1) {  // host memory (pinned or not): the CPU's own
    out->host = static_cast<char*>(const_cast<void*>(p));
    out->keep.reset();
    return HMC_PROV_OK;
  }
  if (rc != HMC_PROV_OK) return rc;
  out->host = held.shadow->host + (reinterpret_cast<uintptr_t>(p) - held.base);
  out->keep = std::move(held.shadow);
  return HMC_PROV_OK;
}

int mem_alloc(void* state, int device, size_t bytes, int alloc_kind, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: null output pointer");
  *ptr = nullptr;
  if (device < 0 || device >= s->devices) {
    return fail(HMC_PROV_ERR_INVALID, "mem_alloc: no device %d (this emulator has %d)", device,
                s->devices);
  }
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: 0 bytes requested");
  switch (alloc_kind) {
    case HMC_ALLOC_DEVICE:
    case HMC_ALLOC_SHAREABLE:  // every device allocation is exportable
      return alloc_device(s, device, bytes, ptr);
    case HMC_ALLOC_PINNED_HOST:
      if (page_round(bytes) == 0) return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: %zu bytes", bytes);
      return alloc_pinned(s, bytes, ptr);
    default:
      return fail(HMC_PROV_ERR_INVALID, "mem_alloc: unknown allocation kind %d", alloc_kind);
  }
}

int mem_free(void* state, int device, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (device < 0 || device >= s->devices) {
    return fail(HMC_PROV_ERR_INVALID, "mem_free: no device %d (this emulator has %d)", device,
                s->devices);
  }
  if (ptr == nullptr) return HMC_PROV_OK;
  if (int rc = wait_device_idle(s, "mem_free"); rc != HMC_PROV_OK) return rc;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  ShadowRef dropped;  // unmapped after the lock, once queued work lets go of it
  std::unique_lock lock(s->mem_mu);
  if (const auto it = s->pinned.find(addr); it != s->pinned.end()) {
    munmap(ptr, it->second);
    s->pinned.erase(it);
    return HMC_PROV_OK;
  }
  const auto it = s->allocs.find(addr);
  if (it == s->allocs.end()) {
    return fail(HMC_PROV_ERR_INVALID,
                "mem_free: %p is not an allocation from mem_alloc (already freed, or not its start)",
                ptr);
  }
  if (it->second.window != device) {
    return fail(HMC_PROV_ERR_INVALID, "mem_free: %p belongs to %s %d, not device %d", ptr,
                it->second.window == s->devices ? "the import window, not a device" : "device",
                it->second.window, device);
  }
  window_give(s->windows[device], addr, it->second.extent);
  dropped = std::move(it->second.shadow);
  s->allocs.erase(it);
  return HMC_PROV_OK;
}

int copy(void* state, void* dst, const void* src, size_t bytes, void* stream) {
  auto* s = static_cast<State*>(state);
  if (bytes == 0) return stream == nullptr ? HMC_PROV_OK : submit(s, "copy", stream, Op{});
  if (dst == nullptr || src == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "copy: null %s with %zu bytes", dst ? "src" : "dst", bytes);
  }
  View d;
  View from;
  int rc = translate(s, "copy dst", dst, bytes, &d);
  if (rc == HMC_PROV_OK) rc = translate(s, "copy src", src, bytes, &from);
  if (rc != HMC_PROV_OK) return rc;
  Op op;
  op.run = [d, from, bytes] { return std::memmove(d.host, from.host, bytes), HMC_PROV_OK; };
  return submit(s, "copy", stream, std::move(op), queue_device(s, {dst, src}));
}

// Every device of the emulator reaches every other: copies go through shadows.
int peer_access(void* state, int device, int peer_device, int* can_access) {
  const auto* s = static_cast<const State*>(state);
  if (can_access == nullptr) return fail(HMC_PROV_ERR_INVALID, "peer_access: null output pointer");
  if (device < 0 || device >= s->devices || peer_device < 0 || peer_device >= s->devices) {
    return fail(HMC_PROV_ERR_INVALID, "peer_access: devices %d and %d (this emulator has %d)",
                device, peer_device, s->devices);
  }
  *can_access = 1;
  return HMC_PROV_OK;
}

// Answers for device memory of every instance of this process, whoever allocated it. An
// import has no device of its own: its copies queue on device 0 (queue_device), so
// that is the device it answers.
int mem_query(void* state, const void* ptr, int* device, void** base, size_t* bytes, uint64_t* id) {
  const auto* s = static_cast<const State*>(state);
  if (device == nullptr || base == nullptr || bytes == nullptr || id == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "mem_query: null output pointer");
  }
  std::shared_lock lock(g_instances_mu);
  for (State* owner : g_instances) {
    const int w = window_of(owner, ptr);
    if (w < 0) continue;
    std::shared_lock mem(owner->mem_mu);
    const auto it = holding(owner, reinterpret_cast<uintptr_t>(ptr));
    if (it == owner->allocs.end()) return 1;  // device address space nobody holds now
    const int d = w == owner->devices ? 0 : w;
    if (d >= s->devices) {
      return fail(HMC_PROV_ERR_INVALID, "mem_query: %p is on device %d of another instance; this one has %d",
                  ptr, d, s->devices);
    }
    *device = d;
    *base = reinterpret_cast<void*>(it->first);
    *bytes = it->second.bytes;
    // The memfd's id is unique to an allocation of this process; an import's is the
    // exporter's, which may meet one of ours: none.
    *id = w == owner->devices ? 0 : it->second.shadow->id;
    return HMC_PROV_OK;
  }
  return 1;
}

size_t release_memory(State* s) {
  std::unique_lock lock(s->mem_mu);
  const size_t n = s->allocs.size() + s->pinned.size();
  for (const auto& [base, length] : s->pinned) munmap(reinterpret_cast<void*>(base), length);
  s->pinned.clear();
  s->allocs.clear();  // drops the shadows
  s->imports.clear();
  return n;
}

}  // namespace hmc::emu
