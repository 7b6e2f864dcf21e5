// Device memory on the point-to-point paths.
//
// Net providers here touch host memory only, so a message whose buffer is device memory
// moves one of two ways:
//   - IPC: a receiver on the same host offers its buffer as an IPC handle (CTS_IPC);
//     the sender imports it once (cached) and writes with the device provider's copy
//     (NVLink / PCIe copy engine for GPU<->GPU, a host<->device copy for a CPU peer),
//     then sends FIN. Plain host memory allocated shareable is offered the same way.
//   - staging: the device side copies through a pinned host buffer and the host bytes
//     travel over the net provider as usual.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/context_impl.h"

namespace hmc::core {

// What a CTS_IPC message carries: the receiver's buffer as its host's processes import it.
// The handle names the whole allocation, so a peer imports it once however many
// messages land at different offsets of it.
struct IpcOffer {
  std::string provider;         // the device provider that exported it ("cuda", "cpu", ...)
  uint64_t alloc_id = 0;        // the exporter's allocation serial: never reused
  uint64_t alloc_bytes = 0;     // size of the exported allocation
  uint64_t offset = 0;          // of the receive buffer inside it
  std::vector<uint8_t> handle;  // the provider's opaque handle of the allocation
};
std::vector<uint8_t> encode_offer(const IpcOffer& offer);
Result<IpcOffer> decode_offer(const uint8_t* data, std::size_t len);

// Per communicator: imported peer memory and pinned host staging buffers.
class DeviceTransfers {
 public:
  explicit DeviceTransfers(ContextImpl& ctx) : ctx_(ctx) {}
  ~DeviceTransfers() { close(); }

  // An offer for [ptr, ptr+bytes), or nullopt when that memory cannot be exported
  // (plain host memory, a provider without IPC, cpu memory not allocated shareable).
  std::optional<IpcOffer> offer(const void* ptr, std::size_t bytes);
  // Writes `bytes` from local `src` into the peer memory `offer` names (imported once per
  // peer and allocation). Fails when this process cannot import it.
  Status write(int peer, const IpcOffer& offer, const void* src, std::size_t bytes);

  // A pinned host buffer of at least `bytes` (from the device's provider where it has
  // pinned memory), reused between messages; give it back with release().
  Result<uint8_t*> stage(const ContextImpl::MemInfo& near, std::size_t bytes);
  void release(uint8_t* buf);

  void close();

 private:
  ContextImpl& ctx_;
  struct Import {
    LoadedProvider* provider;
    void* ptr;
    uint64_t last_use;
  };
  // Imports hold the peer's memory alive, also after the peer freed it (collective scratch
  // comes and goes): beyond this many, the least recently used is closed.
  static constexpr std::size_t kMaxImports = 64;
  uint64_t uses_ = 0;
  std::map<std::pair<int, uint64_t>, Import> imports_;  // (peer, its alloc_id)
  std::map<uint64_t, std::vector<uint8_t>> exports_;    // own alloc_id -> handle
  struct Staging {
    Memory mem;
    bool in_use;
  };
  std::vector<Staging> staging_;
};

}  // namespace hmc::core
