// Host memory and same-host IPC for the cpu provider.
//
// Every block is its own mmap, so it is page-aligned, goes back to the kernel on
// free, and a pinned block is unlocked by the munmap; only plain blocks of 64 KiB and
// more may instead be slots of a huge page (cpu_huge.h). Shareable blocks are memfds
// mapped MAP_SHARED; another process of the same user maps the same file by
// opening /proc/<exporter pid>/fd/<fd>, which works as long as the exporter is
// alive and has not freed the block (mappings already made outlive both).
#include "cpu_memory.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

namespace hmc::cpu {
namespace {

constexpr uint64_t kIpcMagic = 0x31304d5043434d48ull;  // "HMCCPM01"

// What ipc_export writes into the caller's opaque handle buffer.
struct IpcHandle {
  uint64_t magic;
  int32_t pid;   // exporter
  int32_t fd;    // the memfd, in the exporter's fd table
  uint32_t uid;  // exporter's uid, for the error message of a refused open
  uint32_t reserved;
  uint64_t id;      // the memfd is named "hmc-cpu-<id>"
  uint64_t offset;  // of the exported range inside the memfd
  uint64_t bytes;
};
static_assert(sizeof(IpcHandle) <= HMC_IPC_HANDLE_MAX);

size_t page_size() {
  static const size_t size = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return size;
}

// Rounds up to whole pages; false when that overflows.
bool page_round(size_t bytes, size_t* out) {
  const size_t page = page_size();
  if (bytes > SIZE_MAX - (page - 1)) return false;
  *out = (bytes + page - 1) / page * page;
  return true;
}

// Memfd ids differ between processes and between provider instances of one process
// (built-in and plugin), so that a reused fd number is never mistaken for the file.
uint64_t next_memfd_id() {
  static std::atomic<uint64_t> counter{[] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
  }()};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

void memfd_name(uint64_t id, char* out, size_t len) {
  std::snprintf(out, len, "hmc-cpu-%llu", static_cast<unsigned long long>(id));
}

// RAM and swap together: the most a block could ever be backed by. Shareable memory needs
// this check: the kernel's overcommit check counts private mappings only, so a memfd of
// any size maps, and touching it brings the OOM killer instead of an error.
unsigned long long machine_memory() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return ~0ull;
  return (static_cast<unsigned long long>(info.totalram) + info.totalswap) * info.mem_unit;
}

int map_shareable(size_t length, Block* block, void** ptr) {
  block->id = next_memfd_id();
  char name[64];
  memfd_name(block->id, name, sizeof(name));
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return fail(HMC_PROV_ERR_NO_MEMORY, "memfd_create: %s", std::strerror(errno));
  // Sealed once sized: a process that maps it (ipc_import, shm's puts) would die of SIGBUS
  // on a page past the end if the file shrank under its mapping.
  if (ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    const int err = errno;
    close(fd);
    return fail(HMC_PROV_ERR_NO_MEMORY, "sizing and sealing a %zu-byte memfd: %s", length,
                std::strerror(err));
  }
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return fail(HMC_PROV_ERR_NO_MEMORY, "mmap of a %zu-byte memfd: %s", length, std::strerror(err));
  }
  block->fd = fd;
  *ptr = p;
  return HMC_PROV_OK;
}

void unmap_block(State* s, void* base, const Block& b) {
  if (b.slot) s->huge->free_slot(base);
  else munmap(base, b.length);
  if (b.fd >= 0) close(b.fd);
}

}  // namespace

int mem_alloc(void* state, int device, size_t bytes, int alloc_kind, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: null output pointer");
  *ptr = nullptr;
  if (device != 0) {
    return fail(HMC_PROV_ERR_INVALID, "mem_alloc: no device %d (the cpu provider has device 0)",
                device);
  }
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "mem_alloc: 0 bytes requested");
  Block block;
  block.kind = alloc_kind;
  if (!page_round(bytes, &block.length)) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: %zu bytes is more than can be mapped", bytes);
  }
  if (const auto most = machine_memory(); block.length > most) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: %zu bytes is more than this machine's memory and swap (%llu bytes)",
                bytes, most);
  }
  void* p = nullptr;
  switch (alloc_kind) {
    case HMC_ALLOC_DEVICE:
      if (s->huge && s->huge->serves(bytes)) {
        p = s->huge->alloc(bytes, &block.length, &block.slot);
        if (p == nullptr) {
          return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: %zu bytes on huge pages: %s", bytes,
                      std::strerror(errno));
        }
        break;
      }
      [[fallthrough]];
    case HMC_ALLOC_PINNED_HOST:
      p = mmap(nullptr, block.length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: mmap of %zu bytes: %s", block.length,
                    std::strerror(errno));
      }
      break;
    case HMC_ALLOC_SHAREABLE: {
      const int rc = map_shareable(block.length, &block, &p);
      if (rc != HMC_PROV_OK) return rc;
      break;
    }
    default:
      return fail(HMC_PROV_ERR_INVALID, "mem_alloc: unknown allocation kind %d", alloc_kind);
  }
  // Pinning is best effort: RLIMIT_MEMLOCK is often small, and pageable host memory
  // is still correct for every path of this provider, only slower for a NIC.
  if (alloc_kind == HMC_ALLOC_PINNED_HOST && s->pin && mlock(p, block.length) != 0) {
    const int err = errno;
    rlimit lim{};
    getrlimit(RLIMIT_MEMLOCK, &lim);
    log(s, HMC_LOG_DEBUG, "mlock of %zu bytes failed (%s, RLIMIT_MEMLOCK %llu bytes); the block stays pageable",
        block.length, std::strerror(err), static_cast<unsigned long long>(lim.rlim_cur));
  }
  try {
    std::lock_guard lock(s->mutex);
    s->blocks.emplace(reinterpret_cast<uintptr_t>(p), block);
  } catch (const std::bad_alloc&) {
    unmap_block(s, p, block);
    return fail(HMC_PROV_ERR_NO_MEMORY, "mem_alloc: out of memory recording the block");
  }
  *ptr = p;
  return HMC_PROV_OK;
}

int mem_free(void* state, int device, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (device != 0) {
    return fail(HMC_PROV_ERR_INVALID, "mem_free: no device %d (the cpu provider has device 0)",
                device);
  }
  if (ptr == nullptr) return HMC_PROV_OK;  // like free(NULL)
  Block block;
  {
    std::lock_guard lock(s->mutex);
    const auto it = s->blocks.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s->blocks.end()) {
      return fail(HMC_PROV_ERR_INVALID,
                  "mem_free: %p is not a block from mem_alloc (already freed, or not its start)",
                  ptr);
    }
    block = it->second;
    s->blocks.erase(it);
  }
  unmap_block(s, ptr, block);
  return HMC_PROV_OK;
}

// memmove rather than memcpy: as fast, and an overlapping copy stays defined.
int copy(void* state, void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return HMC_PROV_OK;
  if (dst == nullptr || src == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "copy: null %s with %zu bytes", dst ? "src" : "dst", bytes);
  }
  std::memmove(dst, src, bytes);
  return HMC_PROV_OK;
}

int ipc_export(void* state, void* ptr, size_t bytes, void* handle, size_t handle_cap,
               size_t* handle_len) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr || handle == nullptr || handle_len == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: null pointer argument");
  }
  if (bytes == 0) return fail(HMC_PROV_ERR_INVALID, "ipc_export: 0 bytes");
  if (handle_cap < sizeof(IpcHandle)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: handle buffer of %zu bytes, need %zu",
                handle_cap, sizeof(IpcHandle));
  }
  IpcHandle h{};
  {
    std::lock_guard lock(s->mutex);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = s->blocks.upper_bound(addr);
    if (it == s->blocks.begin()) {
      return fail(HMC_PROV_ERR_INVALID, "ipc_export: %p is not in memory from mem_alloc", ptr);
    }
    --it;
    const Block& b = it->second;
    const uintptr_t offset = addr - it->first;
    if (offset >= b.length || bytes > b.length - offset) {
      return fail(HMC_PROV_ERR_INVALID, "ipc_export: [%p, +%zu) is not inside one block", ptr,
                  bytes);
    }
    if (b.kind != HMC_ALLOC_SHAREABLE) {
      return fail(HMC_PROV_ERR_INVALID,
                  "ipc_export: %p was not allocated with HMC_ALLOC_SHAREABLE", ptr);
    }
    h = IpcHandle{kIpcMagic, static_cast<int32_t>(getpid()), b.fd, static_cast<uint32_t>(getuid()),
                  0, b.id, offset, bytes};
  }
  std::memcpy(handle, &h, sizeof(h));
  *handle_len = sizeof(h);
  return HMC_PROV_OK;
}

namespace {

int open_exported(const IpcHandle& h, int* out_fd) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return fail(HMC_PROV_ERR_PEER_LOST,
                  "ipc_import: %s is gone (the exporter exited or freed the memory)", path);
    }
    if (err == EACCES || err == EPERM) {
      return fail(HMC_PROV_ERR_REFUSED,
                  "ipc_import: cannot open %s (%s): exporter uid %u, this process uid %u; "
                  "the cpu provider shares memory only between processes of one user",
                  path, std::strerror(err), h.uid, static_cast<unsigned>(getuid()));
    }
    return fail(HMC_PROV_ERR_INTERNAL, "ipc_import: open %s: %s", path, std::strerror(err));
  }
  // Check the file we now hold (not the path, which could change under us) is the
  // exported memfd and not whatever reused that fd number.
  char self[64];
  char target[128];
  char expected[64];
  std::snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(self, target, sizeof(target) - 1);
  target[n > 0 ? n : 0] = '\0';
  std::snprintf(expected, sizeof(expected), "/memfd:hmc-cpu-%llu",
                static_cast<unsigned long long>(h.id));
  const size_t len = std::strlen(expected);
  if (std::strncmp(target, expected, len) != 0 || (target[len] != '\0' && target[len] != ' ')) {
    close(fd);
    return fail(HMC_PROV_ERR_PEER_LOST,
                "ipc_import: %s is now '%s', not the exported memory (it was freed)", path, target);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < h.offset + h.bytes) {
    close(fd);
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: the exported file is smaller than the handle says");
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    close(fd);
    return fail(HMC_PROV_ERR_INVALID,
                "ipc_import: the exported file is not sealed against shrinking; its owner could "
                "shrink it under the mapping");
  }
  *out_fd = fd;
  return HMC_PROV_OK;
}

}  // namespace

int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (handle == nullptr || ptr == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: null pointer argument");
  }
  *ptr = nullptr;
  IpcHandle h{};
  if (handle_len != sizeof(h)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle of %zu bytes, a cpu handle has %zu",
                handle_len, sizeof(h));
  }
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kIpcMagic || h.pid <= 0 || h.fd < 0 || h.bytes == 0 ||
      h.offset > UINT64_MAX - h.bytes) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: not a handle from the cpu provider's ipc_export");
  }
  int fd = -1;
  const int rc = open_exported(h, &fd);
  if (rc != HMC_PROV_OK) return rc;
  // mmap wants a page-aligned file offset: map from the page start, return the inside.
  const size_t delta = h.offset % page_size();
  size_t length = 0;
  if (!page_round(delta + h.bytes, &length)) {
    close(fd);
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle size %llu too large",
                static_cast<unsigned long long>(h.bytes));
  }
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(h.offset - delta));
  const int err = errno;
  close(fd);  // the mapping keeps the file alive
  if (base == MAP_FAILED) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "ipc_import: mmap of %zu bytes: %s", length,
                std::strerror(err));
  }
  void* p = static_cast<char*>(base) + delta;
  try {
    std::lock_guard lock(s->mutex);
    s->mappings.emplace(reinterpret_cast<uintptr_t>(p), Mapping{base, length, static_cast<size_t>(h.bytes)});
  } catch (const std::bad_alloc&) {
    munmap(base, length);
    return fail(HMC_PROV_ERR_NO_MEMORY, "ipc_import: out of memory recording the mapping");
  }
  *ptr = p;
  return HMC_PROV_OK;
}

int ipc_close(void* state, void* ptr) {
  auto* s = static_cast<State*>(state);
  Mapping m;
  {
    std::lock_guard lock(s->mutex);
    const auto it = s->mappings.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s->mappings.end()) {
      return fail(HMC_PROV_ERR_INVALID, "ipc_close: %p was not returned by ipc_import", ptr);
    }
    m = it->second;
    s->mappings.erase(it);
  }
  munmap(m.base, m.length);
  return HMC_PROV_OK;
}

int ipc_extent(void* state, void* ptr, size_t* bytes) {
  auto* s = static_cast<State*>(state);
  if (bytes == nullptr) return fail(HMC_PROV_ERR_INVALID, "ipc_extent: null output pointer");
  std::lock_guard lock(s->mutex);
  const auto it = s->mappings.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s->mappings.end()) return fail(HMC_PROV_ERR_INVALID, "ipc_extent: %p was not returned by ipc_import", ptr);
  *bytes = it->second.bytes;  // open_exported checked the file holds offset + bytes
  return HMC_PROV_OK;
}

size_t release_all(State* s) {
  std::lock_guard lock(s->mutex);
  const size_t n = s->blocks.size() + s->mappings.size();
  for (const auto& [base, block] : s->blocks) unmap_block(s, reinterpret_cast<void*>(base), block);
  for (const auto& [ptr, m] : s->mappings) munmap(m.base, m.length);
  s->blocks.clear();
  s->mappings.clear();
  return n;
}

}  // namespace hmc::cpu
