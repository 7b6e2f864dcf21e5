// IPC of emulated device memory between processes of one host and user.
//
// The handle names the memfd of the allocation ({pid, fd number, memfd id, allocation
// size, offset of the exported pointer}), whichever instance of the exporting process
// owns it; the importer opens /proc/<pid>/fd/<fd>, checks by its name that it is that
// memfd and not a file that reused the number, maps all of it as a new shadow and hands
// out a NEW device pointer in its own import window (base + offset). That holds in the
// exporting process too (pid is then its own). Importing the same allocation again
// reuses the mapping and counts a reference; ipc_close drops one. Both sides write the
// same memfd pages. Each export and import is noted in HMC_EMU_REGISTER_LOG.
// Unless HMC_EMU_IMPORT_SAME_ADDRESS=0, an import of an allocation fails while some
// instance of this process holds an import of another one the exporter had at the same
// address (freed since), noting "ipc_import_refused": CUDA refuses it so (cudaErrorAlreadyMapped) where
// the exporter's allocator put a new small allocation in a block the importer still maps.
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu_ops.h"

namespace hmc::emu {
namespace {

constexpr uint64_t kIpcMagic = 0x31304d4543434d48ull;  // "HMCCEM01"

struct IpcHandle {
  uint64_t magic;
  int32_t pid;     // exporter
  int32_t fd;      // its memfd, in the exporter's fd table
  int32_t device;  // exporter's device, for messages
  uint32_t uid;
  uint64_t id;      // the memfd is named "hmc-emu-<id>"
  uint64_t size;    // bytes of the exporter's allocation
  uint64_t offset;  // of the exported pointer inside it
  uint64_t bytes;   // exported range
  uint64_t base;    // the allocation's device address in the exporter
};
static_assert(sizeof(IpcHandle) <= HMC_IPC_HANDLE_MAX);

std::string key_of(const IpcHandle& h) {
  return std::to_string(h.pid) + ":" + std::to_string(h.id);
}

std::string exporter_at(const IpcHandle& h) {
  return std::to_string(h.pid) + "@" + std::to_string(h.base);
}

// Opens the exporter's memfd and checks it is the one the handle names.
int open_exported(const IpcHandle& h, size_t length, int* out) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return fail(HMC_PROV_ERR_PEER_LOST, "ipc_import: %s is gone (exporter exited or freed it)", path);
    }
    return fail(err == EACCES || err == EPERM ? HMC_PROV_ERR_REFUSED : HMC_PROV_ERR_INTERNAL,
                "ipc_import: open %s: %s (exporter uid %u, ours %u)", path, std::strerror(err),
                h.uid, static_cast<unsigned>(getuid()));
  }
  char self[64];
  char target[128] = {};
  char expected[64];
  std::snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(self, target, sizeof(target) - 1);
  target[n > 0 ? n : 0] = '\0';
  std::snprintf(expected, sizeof(expected), "/memfd:hmc-emu-%llu",
                static_cast<unsigned long long>(h.id));
  const size_t len = std::strlen(expected);
  struct stat st {};
  if (std::strncmp(target, expected, len) != 0 || (target[len] != '\0' && target[len] != ' ') ||
      fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < length) {
    close(fd);
    return fail(HMC_PROV_ERR_PEER_LOST,
                "ipc_import: %s is '%s', not the exported device memory (it was freed)", path, target);
  }
  *out = fd;
  return HMC_PROV_OK;
}

int map_import(State* s, const IpcHandle& h, ShadowRef* out) {
  const size_t length = page_round(h.size);
  if (length == 0 || length > s->memory) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle size %llu does not fit the import window",
                static_cast<unsigned long long>(h.size));
  }
  int fd = -1;
  if (const int rc = open_exported(h, length, &fd); rc != HMC_PROV_OK) return rc;
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "ipc_import: mmap of %zu bytes: %s", length, std::strerror(err));
  }
  auto sh = std::make_shared<Shadow>();
  sh->host = static_cast<char*>(p);
  sh->length = length;
  sh->id = h.id;
  *out = std::move(sh);
  return HMC_PROV_OK;
}

// Hands out the import of a checked handle: the mapping of an earlier import of the
// same allocation, with one more reference, or a new one.
int attach(State* s, const IpcHandle& h, void** ptr) {
  const std::string key = key_of(h);
  {  // imported before: one more reference to the same range
    std::unique_lock lock(s->mem_mu);
    if (const auto found = s->imports.find(key); found != s->imports.end()) {
      Allocation& a = s->allocs.at(found->second);
      if (h.offset + h.bytes > a.bytes) {
        return fail(HMC_PROV_ERR_INVALID, "ipc_import: the handle's range ends past the allocation as first imported");
      }
      const uintptr_t p = found->second + h.offset;
      a.imported.insert(p);
      *ptr = reinterpret_cast<void*>(p);
      return HMC_PROV_OK;
    }
  }
  if (s->import_same_address && any_import_at(exporter_at(h), key)) {
    note(s, "ipc_import_refused", h.bytes);
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: an import of an earlier allocation of pid %d at the same "
                "address is still open in this process (CUDA: cudaErrorAlreadyMapped)", h.pid);
  }
  Allocation a;
  if (const int rc = map_import(s, h, &a.shadow); rc != HMC_PROV_OK) return rc;
  a.bytes = h.size;
  a.extent = a.shadow->length;
  a.window = s->devices;
  a.import_key = key;
  a.exporter_at = exporter_at(h);
  std::unique_lock lock(s->mem_mu);
  if (const auto raced = s->imports.find(key); raced != s->imports.end()) {  // another thread won
    const uintptr_t p = raced->second + h.offset;
    s->allocs.at(raced->second).imported.insert(p);
    *ptr = reinterpret_cast<void*>(p);
    return HMC_PROV_OK;
  }
  const uintptr_t base = window_take(s->windows[s->devices], a.extent);
  if (base == 0) {
    return fail(HMC_PROV_ERR_NO_MEMORY, "ipc_import: the import window has no free %zu bytes left",
                a.extent);
  }
  a.imported.insert(base + h.offset);
  s->imports.emplace(key, base);
  s->allocs.emplace(base, std::move(a));
  *ptr = reinterpret_cast<void*>(base + h.offset);
  return HMC_PROV_OK;
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
  // Device memory of any instance of this process, as CUDA exports any cudaMalloc pointer.
  Held held;
  const int rc = find_device(s, "ipc_export", ptr, bytes, &held);
  if (rc == 1) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: %p is host memory, not device memory of this process", ptr);
  }
  if (rc != HMC_PROV_OK) return rc;
  if (held.device < 0) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_export: %p is imported memory; export it from its owner", ptr);
  }
  if (!s->export_foreign && window_of(s, ptr) < 0) {
    note(s, "ipc_export_refused", bytes);
    return fail(HMC_PROV_ERR_UNSUPPORTED, "ipc_export: %p is another instance's memory (HMC_EMU_EXPORT_FOREIGN=0)", ptr);
  }
  const IpcHandle h{kIpcMagic, static_cast<int32_t>(getpid()), held.shadow->fd, held.device,
                    static_cast<uint32_t>(getuid()), held.shadow->id, held.bytes,
                    reinterpret_cast<uintptr_t>(ptr) - held.base, bytes, held.base};
  std::memcpy(handle, &h, sizeof(h));
  *handle_len = sizeof(h);
  note(s, "ipc_export", bytes);
  return HMC_PROV_OK;
}

int ipc_import(void* state, const void* handle, size_t handle_len, void** ptr) {
  auto* s = static_cast<State*>(state);
  if (handle == nullptr || ptr == nullptr) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: null pointer argument");
  }
  *ptr = nullptr;
  IpcHandle h{};
  if (handle_len != sizeof(h)) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: handle of %zu bytes, an emu handle has %zu",
                handle_len, sizeof(h));
  }
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kIpcMagic || h.pid <= 0 || h.fd < 0 || h.bytes == 0 || h.offset >= h.size ||
      h.bytes > h.size - h.offset) {
    return fail(HMC_PROV_ERR_INVALID, "ipc_import: not a handle from the emu provider's ipc_export");
  }
  const int rc = attach(s, h, ptr);
  if (rc == HMC_PROV_OK) note(s, "ipc_import", h.bytes);
  return rc;
}

int ipc_extent(void* state, void* ptr, size_t* bytes) {
  auto* s = static_cast<State*>(state);
  if (bytes == nullptr) return fail(HMC_PROV_ERR_INVALID, "ipc_extent: null output pointer");
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock lock(s->mem_mu);
  auto it = s->allocs.upper_bound(addr);
  if (window_of(s, ptr) == s->devices && it != s->allocs.begin()) {
    --it;
    const Allocation& a = it->second;
    if (a.imported.count(addr) != 0 && addr - it->first <= a.bytes) {
      *bytes = a.bytes - (addr - it->first);  // map_import checked the memfd holds a.bytes
      return HMC_PROV_OK;
    }
  }
  return fail(HMC_PROV_ERR_INVALID, "ipc_extent: %p was not returned by ipc_import (or is closed)", ptr);
}

int ipc_close(void* state, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (int rc = wait_device_idle(s, "ipc_close"); rc != HMC_PROV_OK) return rc;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  ShadowRef dropped;  // unmapped after the lock, once queued work lets go of it
  std::unique_lock lock(s->mem_mu);
  auto it = s->allocs.upper_bound(addr);
  if (window_of(s, ptr) == s->devices && it != s->allocs.begin()) {
    --it;
    Allocation& a = it->second;
    if (const auto p = a.imported.find(addr); p != a.imported.end()) {
      a.imported.erase(p);
      if (a.imported.empty()) {
        window_give(s->windows[s->devices], it->first, a.extent);
        s->imports.erase(a.import_key);
        dropped = std::move(a.shadow);
        s->allocs.erase(it);
      }
      return HMC_PROV_OK;
    }
  }
  return fail(HMC_PROV_ERR_INVALID, "ipc_close: %p was not returned by ipc_import (or is closed)", ptr);
}

}  // namespace hmc::emu
