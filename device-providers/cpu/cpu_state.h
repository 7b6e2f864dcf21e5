// State shared by the files of the cpu device provider, and its error and log helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "cpu_huge.h"

#include "hmc/provider/device.h"

namespace hmc::cpu {

// A block handed out by mem_alloc: its page-rounded length, its kind, whether it is a slot
// of a huge-page chunk (cpu_huge.h), and for shareable memory the memfd behind it, kept
// open so that importers can reach it.
struct Block {
  size_t length = 0;
  int kind = HMC_ALLOC_DEVICE;
  bool slot = false;
  int fd = -1;
  uint64_t id = 0;  // part of the memfd's name: lets an importer check it opened the right file
};

// A view of another process's shareable memory, mapped by ipc_import.
struct Mapping {
  void* base = nullptr;
  size_t length = 0;
  size_t bytes = 0;  // from the pointer ipc_import returned: within the file, checked
};

struct State {
  hmc_host_services_t host{};
  bool pin = true;    // HMC_CPU_PIN
  bool wide = false;  // run the AVX2/F16C kernels (HMC_CPU_SIMD and the CPU allow it)
  std::unique_ptr<HugeArena> huge;  // HMC_CPU_HUGE_PAGES, where the kernel has them
  hmc_device_info_t info{};
  std::mutex mutex;                       // guards blocks and mappings
  std::map<uintptr_t, Block> blocks;      // keyed by base address
  std::map<uintptr_t, Mapping> mappings;  // keyed by the pointer ipc_import returned
};

// Records a failure message for the calling thread (printf format) and returns `code`.
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// The calling thread's last failure message ("" before the first failure).
const char* last_error_text();
// Logs through the host's callback. Formats only when the host gave one.
void log(const State* s, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace hmc::cpu
