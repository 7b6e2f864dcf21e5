// Context: configuration, loaded providers, devices and host memory services.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hmc/memory.h"
#include "hmc/status.h"
#include "hmc/types.h"
#include "hmc/unique_id.h"

namespace hmc {

namespace core {
class ContextImpl;
}

struct ContextOptions {
  // HMC_* settings that take precedence over the environment, e.g.
  // {"HMC_PROVIDERS", "cpu,tcp"}. A name that is not HMC_* nor in the table is an error;
  // an HMC_* name no table claims (core's, or a loaded provider's) is logged at warn
  // level and ignored, as in the environment.
  std::map<std::string, std::string> settings;
};

struct ProviderInfo {
  std::string name;
  std::string kind;  // "device" or "net"
  std::string origin;  // "built-in" or the file it came from
  uint32_t abi_version = 0;
  // What it can do as configured: the table's capability bits, less those a loaded net
  // provider withdrew (ucx with shared memory only: no "remote").
  uint64_t caps = 0;
  std::vector<std::string> cap_names;
  bool available = false;
  std::string reason;  // why not available / not loaded, empty when available
};

struct DeviceInfo {
  DeviceId id;
  std::string vendor;
  std::string model;
  std::string pci_bus_id;
  int numa_node = -1;
  MemKind mem_kind = MemKind::kHost;
  uint64_t memory_bytes = 0;
};

struct ConfigEntry {
  std::string name, type, default_value, help, value, source;  // source: "default", "env", "option"
};

// Communicators, Memory, MemoryRegions and Streams made from a Context must be destroyed
// before it. A Request still pending when it goes fails with kFinalized when waited on.
class Context {
 public:
  static Result<Context> create(ContextOptions options = {});
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  ~Context();

  // False once moved from: its calls then fail with kInvalidArgument (the lists come back
  // empty, device_of says cpu:0), as do Communicator::create, from_env, Stream::create
  // and split on it.
  bool valid() const { return impl_ != nullptr; }

  std::vector<ProviderInfo> providers() const;
  std::vector<DeviceInfo> devices() const;
  std::vector<ConfigEntry> config() const;

  // Device-agnostic memory: allocate on any device of any provider. Buffers need not
  // come from here: HMC asks the device providers that can say (cuda; HMC_MEM_QUERY)
  // whether a pointer it did not allocate is their device memory, so an application's
  // own cudaMalloc works (by IPC between processes of one host where the provider can
  // export it, else through host memory). A provider that cannot say has its device
  // memory known by these allocations only: its other device pointers are taken for
  // host memory, and a copy or send from them faults.
  Result<Memory> alloc(const DeviceId& device, std::size_t bytes,
                       AllocKind kind = AllocKind::kDefault);
  // Copy between any two pointers HMC knows (allocated here or plain host memory).
  Status copy(void* dst, const void* src, std::size_t bytes);
  // Which device a pointer lives on; plain host memory is {"cpu", 0}.
  DeviceId device_of(const void* ptr) const;

  // Starts this process's bootstrap root (rank 0) and returns the id every rank passes
  // to Communicator::create: the root address and a fresh random job secret.
  Result<UniqueId> create_unique_id();

  core::ContextImpl& impl() { return *impl_; }

 private:
  explicit Context(std::unique_ptr<core::ContextImpl> impl);
  std::unique_ptr<core::ContextImpl> impl_;
};

}  // namespace hmc
