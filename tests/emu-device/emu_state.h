// State shared by the files of the emulated device provider ("emu"), its memory
// model (device windows, shadows, translation) and its error and log helpers.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "cpu_state.h"  // the reduce kernels' settings (hmc::cpu::State::wide)
#include "hmc/provider/device.h"

namespace hmc::emu {

// The real bytes of one allocation: a memfd mapped MAP_SHARED somewhere the CPU can
// reach. Queued stream work holds a reference, so a free cannot unmap it under a copy.
struct Shadow {
  char* host = nullptr;
  size_t length = 0;
  int fd = -1;  // kept open by the exporter (importers reach it through /proc/<pid>/fd)
  uint64_t id = 0;
  Shadow() = default;
  Shadow(const Shadow&) = delete;
  Shadow& operator=(const Shadow&) = delete;
  ~Shadow();
};
using ShadowRef = std::shared_ptr<Shadow>;

// A range of device address space (PROT_NONE) and the shadow it stands for.
struct Allocation {
  size_t bytes = 0;   // what was asked for: translation refuses anything past it
  size_t extent = 0;  // page-rounded length of the device range
  int window = 0;     // device index, or State::devices for imported memory
  ShadowRef shadow;
  std::string import_key;            // imports: "<pid>:<memfd id>"
  std::string exporter_at;           // imports: "<pid>@<the exporter's device address>"
  std::multiset<uintptr_t> imported;  // imports: every pointer ipc_import handed out
};

// One device's slice of the reserved range, with its free list (start -> length).
struct Window {
  uintptr_t base = 0;
  size_t size = 0;
  std::map<uintptr_t, size_t> free;
};

class Stream;
class Channel;
struct Event;

struct State {
  hmc_host_services_t host{};
  int devices = 2;          // HMC_EMU_DEVICES
  uint64_t memory = 0;      // HMC_EMU_MEMORY, per device
  uint32_t delay_us = 0;    // HMC_EMU_STREAM_DELAY_US
  bool stream_wake = true;  // HMC_EMU_STREAM_WAKE
  uint32_t query_lag_us = 0;  // HMC_EMU_QUERY_LAG_US
  bool export_foreign = true;  // HMC_EMU_EXPORT_FOREIGN
  bool import_same_address = true;  // HMC_EMU_IMPORT_SAME_ADDRESS
  bool full_names = false;           // HMC_EMU_FULL_NAMES
  uint64_t fail_op = 0;     // HMC_EMU_FAIL_STREAM_OP: this stream operation (1-based) fails
  uint32_t queues = 0;      // HMC_EMU_QUEUES: hardware queues per device (0: one per stream)
  bool device_wide_frees = false;  // HMC_EMU_DEVICE_WIDE_FREES
  std::atomic<uint64_t> stream_ops{0};  // stream operations started, for fail_op
  std::string register_log;  // HMC_EMU_REGISTER_LOG: file that register and IPC events go to
  hmc::cpu::State cpu;      // handed to the cpu reduce kernels

  void* range = nullptr;  // PROT_NONE reservation: devices windows, then the import window
  size_t range_len = 0;

  std::shared_mutex mem_mu;  // guards windows, allocs, imports, pinned, registered
  std::vector<Window> windows;
  std::map<uintptr_t, Allocation> allocs;     // device and imported ranges, by device base
  std::map<std::string, uintptr_t> imports;   // import key -> device base
  std::map<uintptr_t, size_t> pinned;         // pinned host blocks -> length
  std::map<uintptr_t, size_t> registered;     // host_register ranges -> length

  std::mutex obj_mu;  // guards the handle tables; never held while a worker is joined
  std::map<const void*, std::shared_ptr<Stream>> streams;
  std::map<const void*, std::shared_ptr<Event>> events;
  std::map<const void*, std::shared_ptr<std::atomic<uint32_t>>> flags;  // queued waits share them
  std::vector<std::vector<std::shared_ptr<Channel>>> channels;  // [device][queue], with HMC_EMU_QUEUES
  std::vector<uint32_t> next_channel;                            // [device]: round robin
};

// A host view of device or host memory: the shadow for device memory (kept alive by
// `keep`), the pointer itself for anything outside the reserved range.
struct View {
  char* host = nullptr;
  ShadowRef keep;
};

// Translates [p, p + bytes); fails with INVALID when p is device address space outside
// a live allocation or the range runs past the allocation's end. Device memory of
// another instance of this process translates too, as a GPU copies any allocation of
// its runtime: that is how tests model an application's own cudaMalloc.
int translate(State* s, const char* what, const void* p, size_t bytes, View* out);
// A live allocation of some instance of this process, as find_device saw it.
struct Held {
  int device = -1;  // the owner's device; -1 for memory the owner imported
  uintptr_t base = 0;
  size_t bytes = 0;
  ShadowRef shadow;
};
// The allocation, of whichever instance of this process owns p's device address space,
// that holds all of [p, p + bytes) (the lookup translate makes): OK, 1 when p is no
// instance's device address space (host memory), or INVALID (message names `what`).
int find_device(State* s, const char* what, const void* p, size_t bytes, Held* out);
// The live instances of this process, which translate and mem_query search: init adds
// one, fini removes it. The list's lock is taken before any instance's mem_mu.
void add_instance(State* s);
void remove_instance(State* s);
// Whether some instance of this process holds an import of another allocation than
// `key` that the exporter had at `exporter_at` ("<pid>@<address>"): CUDA's imports are
// the process's, not one context's.
bool any_import_at(const std::string& exporter_at, const std::string& key);
// The device a pointer belongs to: 0..devices-1, devices for imports, -1 for host memory.
int window_of(const State* s, const void* p);
size_t page_round(size_t bytes);
// Reserves device address space in window `w`; 0 when it is full.
uintptr_t window_take(Window& w, size_t extent);
void window_give(Window& w, uintptr_t base, size_t extent);
// Unmaps what the host left allocated or imported; called by fini. Returns how many.
size_t release_memory(State* s);

// Records a failure message for the calling thread (printf format) and returns `code`.
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int vfail(int code, const char* fmt, va_list args);
const char* last_error_text();
void log(const State* s, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void wake(const State* s);

}  // namespace hmc::emu
