// Host memory registration of the emulated provider (HMC_DEV_CAP_HOST_REGISTER). There is
// nothing to page-lock; what it does is hold the host to the ABI's rules, which a GPU
// driver enforces only by failing or corrupting later: the range must be mapped host
// memory, not overlap one already registered, and still be mapped when unregistered.
// With HMC_EMU_REGISTER_LOG set, each event appends a line to that file so that tests
// across processes can count them: "register N", "unregister N",
// "unmapped-before-unregister N" and, from fini, "left-registered N" (N in bytes); fini
// also notes the streams, events and flags the host left ("left-streams N", ...), and
// emu_ipc.cpp each export and import ("ipc_export N", "ipc_import N", N the range's bytes).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iterator>
#include <vector>

#include "emu_ops.h"

namespace hmc::emu {

void note(const State* s, const char* what, size_t bytes) {
  if (s->register_log.empty()) return;
  char line[64];
  const int n = std::snprintf(line, sizeof(line), "%s %zu\n", what, bytes);
  const int fd = ::open(s->register_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (::write(fd, line, static_cast<size_t>(n)) != n) log(s, HMC_LOG_WARN, "register log: short write");
  ::close(fd);
}

namespace {

// Whether every page of [p, p + bytes) is mapped (mincore fails with ENOMEM on a hole).
bool mapped(const void* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  std::vector<unsigned char> pages((end - start + page - 1) / page);
  return mincore(reinterpret_cast<void*>(start), end - start, pages.data()) == 0;
}

}  // namespace

int host_register(void* state, void* ptr, size_t bytes) {
  auto* s = static_cast<State*>(state);
  if (ptr == nullptr || bytes == 0) {
    return fail(HMC_PROV_ERR_INVALID, "host_register: %s", ptr == nullptr ? "null pointer" : "0 bytes");
  }
  if (window_of(s, ptr) >= 0) return fail(HMC_PROV_ERR_INVALID, "host_register: %p is device memory", ptr);
  if (!mapped(ptr, bytes)) return fail(HMC_PROV_ERR_INVALID, "host_register: [%p, +%zu) is not mapped", ptr, bytes);
  const auto key = reinterpret_cast<uintptr_t>(ptr);
  std::unique_lock lock(s->mem_mu);
  const auto next = s->registered.lower_bound(key);
  if ((next != s->registered.end() && next->first < key + bytes) ||
      (next != s->registered.begin() && std::prev(next)->first + std::prev(next)->second > key)) {
    return fail(HMC_PROV_ERR_INVALID, "host_register: [%p, +%zu) overlaps a registered range", ptr, bytes);
  }
  s->registered.emplace(key, bytes);
  note(s, "register", bytes);
  return HMC_PROV_OK;
}

int host_unregister(void* state, void* ptr) {
  auto* s = static_cast<State*>(state);
  if (int rc = wait_device_idle(s, "host_unregister"); rc != HMC_PROV_OK) return rc;
  size_t bytes = 0;
  {
    std::unique_lock lock(s->mem_mu);
    const auto it = s->registered.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s->registered.end()) {
      return fail(HMC_PROV_ERR_INVALID, "host_unregister: %p was not registered", ptr);
    }
    bytes = it->second;
    s->registered.erase(it);
  }
  if (!mapped(ptr, bytes)) {
    note(s, "unmapped-before-unregister", bytes);
    return fail(HMC_PROV_ERR_INVALID, "host_unregister: [%p, +%zu) was unmapped while registered", ptr, bytes);
  }
  note(s, "unregister", bytes);
  return HMC_PROV_OK;
}

size_t release_registrations(State* s) {
  std::unique_lock lock(s->mem_mu);
  for (const auto& [base, bytes] : s->registered) note(s, "left-registered", bytes);
  const size_t n = s->registered.size();
  s->registered.clear();
  return n;
}

}  // namespace hmc::emu
