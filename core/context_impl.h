// ContextImpl: the engine behind hmc::Context — config, providers, memory, progress.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/plugin_registry.h"
#include "core/progress.h"
#include "core/stream_order.h"
#include "hmc/context.h"

namespace hmc::core {

class IpcImports;  // ipc_imports.h

class ContextImpl {
 public:
  static Result<std::unique_ptr<ContextImpl>> create(const ContextOptions& options);
  ~ContextImpl();

  Config& config() { return config_; }
  PluginRegistry& registry() { return *registry_; }
  const std::shared_ptr<ProgressEngine>& engine() const { return engine_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // A communicator of this context has `n` ranks on this machine (this one included), and
  // `helpers`: some of its paths need a provider's thread to move messages (a net provider
  // without HMC_NET_CAP_POLLED). Waiters poll back to back between yields only while the
  // busiest such communicator leaves every rank a CPU, and for messages where any needs
  // helpers, a second one for the helper (progress.h), unless HMC_YIELD_EVERY says
  // otherwise.
  void note_host_ranks(int n, bool helpers);
  Clock::time_point deadline() const { return deadline_after(timeout_); }

  std::vector<DeviceInfo> devices() const;
  Result<Memory> alloc(const DeviceId& device, std::size_t bytes, AllocKind kind);
  void free(const DeviceId& device, void* ptr);
  Status copy(void* dst, const void* src, std::size_t bytes);
  // Registers the host allocation holding [ptr, ptr+bytes) with `by` (HMC_DEV_CAP_HOST_REGISTER)
  // when `by` copies at least HMC_HOST_REGISTER bytes of it at once: once per allocation,
  // undone by free(). Memory HMC did not allocate is left alone; a refusal only costs speed.
  void pin_for(LoadedProvider* by, const void* ptr, std::size_t bytes);
  // Bytes from which host memory is registered for device copies (0: never).
  std::size_t host_register_min() const { return host_register_min_; }
  // Memory HMC did not allocate is host memory, unless a device provider that answers
  // mem_query (HMC_MEM_QUERY) says it is its device memory: device_of, provider_of,
  // mem_info and device_mem all ask it.
  DeviceId device_of(const void* ptr) const;
  // Whether [ptr, ptr+bytes) lies inside one allocation made here.
  bool owns(const void* ptr, std::size_t bytes) const;
  // Grows with every free: caches keyed by address flush when it changes.
  uint64_t free_generation() const { return free_generation_.load(std::memory_order_acquire); }
  // The device provider that owns `ptr` (cpu for plain host memory).
  LoadedProvider* provider_of(const void* ptr) const;

  // What HMC knows of the memory at [ptr, ptr+bytes).
  struct MemInfo {
    LoadedProvider* provider = nullptr;  // cpu for plain host memory
    int device = 0;
    bool device_mem = false;  // the CPU cannot touch it: move it with the provider's copy
    uint64_t alloc_id = 0;    // unique per allocation in this process, 0 for memory HMC did not allocate
                              // (host memory, or device memory a provider's mem_query knew)
    AllocKind kind = AllocKind::kDefault;
    const uint8_t* base = nullptr;  // the allocation's start, null for host memory not HMC's
    std::size_t alloc_bytes = 0;
    uint64_t foreign_id = 0;  // mem_query's id of device memory HMC did not allocate (0: none)
  };
  MemInfo mem_info(const void* ptr, std::size_t bytes) const;
  // mem_info(ptr, bytes).device_mem, without the lock while no device memory is allocated
  // (every send and receive asks).
  bool device_mem(const void* ptr, std::size_t bytes) const;

  // dst = a op b elementwise, on the device of dst (collectives use this).
  Status reduce(void* dst, const void* a, const void* b, std::size_t count, DataType dtype, ReduceOp op);
  Status divide(void* buf, std::size_t count, DataType dtype, uint64_t divisor);

  StreamRetirement& stream_retirement() { return *retirement_; }
  // Peer memory imported over IPC, shared by this context's communicators.
  IpcImports& ipc_imports() { return *ipc_imports_; }

  // The id names HMC_BOOTSTRAP_ADDR, else `reachable_at` (an address of this host that the
  // job's ranks reach: a communicator's control connection, for split), else the host
  // name's IPv4 address (which may be loopback: Debian's 127.0.1.1).
  Result<UniqueId> create_unique_id(const std::string& reachable_at = "");
  // Starts a bootstrap root on host:port for from_env's rank 0; kept alive with the context.
  Status start_root(const std::string& host, uint16_t port, const Secret& secret);

  // This host's identity: HMC_HOST_ID, else hostname + boot id.
  const std::string& host_id() const { return host_id_; }

 private:
  ContextImpl() = default;
  struct Allocation {
    std::size_t bytes;
    LoadedProvider* provider;
    int device;
    uint64_t id;
    AllocKind kind;
    bool device_mem;
    LoadedProvider* net = nullptr;  // set when a net provider's mem_alloc made it
    void* mr = nullptr;             // that provider's registration of it
    LoadedProvider* pinned_by = nullptr;  // the device provider it is host_register'ed with
    bool pin_failed = false;              // host_register refused it: not asked again
  };
  // Host memory from net_alloc_'s mem_alloc, or null (with a logged reason) when it cannot.
  void* net_alloc(std::size_t bytes, void** mr);
  // The allocation holding [ptr, ptr+bytes) as {start, allocation}, or null. Caller holds mu_.
  const std::pair<const uintptr_t, Allocation>* find_allocation(const void* ptr, std::size_t bytes) const;
  // mem_info without the fast path; takes mu_, then (outside it) asks the queriers.
  MemInfo lookup(const void* ptr, std::size_t bytes) const;
  // Memory HMC did not allocate, as the first device provider that knows it describes it,
  // or plain host memory.
  MemInfo foreign(const void* ptr) const;
  Config config_;
  std::shared_ptr<ProgressEngine> engine_ = std::make_shared<ProgressEngine>();
  std::unique_ptr<PluginRegistry> registry_;
  LoadedProvider* net_alloc_ = nullptr;  // the net provider whose mem_alloc serves host memory, or null
  std::vector<LoadedProvider*> queriers_;  // device providers asked about unknown memory (HMC_MEM_QUERY)
  std::chrono::milliseconds timeout_{60000};
  int64_t yield_every_ = 0;  // HMC_YIELD_EVERY
  int host_ranks_ = 1;       // most ranks on this machine in one communicator (mu_)
  bool host_helpers_ = false;  // a communicator's path needs a provider's thread (mu_)
  std::size_t host_register_min_ = 0;
  std::string host_id_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Allocation> allocations_;  // start address -> allocation
  std::atomic<int> device_allocs_{0};  // of them, device memory (changed under mu_)
  std::atomic<uint64_t> free_generation_{0};
  std::vector<std::unique_ptr<BootstrapRoot>> roots_;  // guarded by mu_
  void keep_root(std::unique_ptr<BootstrapRoot> root);
  // Declared after registry_: freed first, while the providers are still loaded.
  std::unique_ptr<StreamRetirement> retirement_ = std::make_unique<StreamRetirement>();
  std::unique_ptr<IpcImports> ipc_imports_;  // closed first, while the providers are loaded
};

// Reads provider `p`'s last error for messages.
std::string provider_error(const LoadedProvider& p);
// What a call given a moved-from Context answers ("<where>: context is empty ...").
Status empty_context(const std::string& where);

}  // namespace hmc::core
